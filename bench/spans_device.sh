#!/usr/bin/env bash
# The GPU checks of ring attention's wgmma span kernels (k_wg_spans_*,
# off unless RLPIPE_CUDA_SPANS_WGMMA=1) and of the causal wgmma kernels
# that now share their tile loops, in one device call on a Hopper GPU:
#
#   1. gpu/cuda's kernel compile and attention tests (TestAttentionSpans
#      runs every case with and without the wgmma span kernels);
#   2. BenchmarkOps' span and causal attention rows (the span blocks of a
#      cp 2 step on the SIMT and the wgmma kernels; the causal kernels
#      against the figures of docs/performance.md);
#   3. with two GPUs or more, stages' TestRunTinyCUDACP2 with the wgmma
#      span kernels.
#
# Logs go to $OUT/spans, tarred into $OUT/spans.tgz. Build first:
#
#   L='-ldflags=-s -w'
#   go test -c "$L" -o .devbin/cuda.test ./gpu/cuda
#   go test -c "$L" -o .devbin/stages.test ./stages
#
# Then, for the speed of context parallelism with them, the cp phase of
# bench/scale_device.sh with RLPIPE_CUDA_SPANS_WGMMA=1 in its environment
# (SCALE_CP_RUNS="cp2 recompute" keeps it to one call).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/spans-out}
B=$PWD/.devbin
. bench/device_lib.sh
workdir spans # D=$OUT/spans
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$D/env.txt" 2>&1
say "$(tail -n +2 "$D/env.txt" | head -n 1)"
(cd gpu/cuda && run cuda-tests 300 "$B/cuda.test" -test.v \
	-test.run 'TestKernelsCompile|TestAttention|TestTensorCore')
(cd gpu/cuda && run cuda-bench 240 "$B/cuda.test" -test.run '^$' -test.benchtime 20x \
	-test.bench 'Ops/attention_(spans|fwd_8x2048|bwd_8x2048)')
grep -h 'ns/op' "$D/cuda-bench.log" | tee -a "$D/summary.txt"
if (($(nvidia-smi -L | grep -c '^GPU') >= 2)) && [[ -x $B/stages.test ]]; then
	(cd stages && run stages-cp2 240 env RLPIPE_CUDA_SPANS_WGMMA=1 "$B/stages.test" -test.v -test.run 'TestRunTinyCUDACP2$')
else
	say "stages-cp2: fewer than 2 GPUs or no stages.test; skipped"
fi
tar czf "$OUT/spans.tgz" -C "$OUT" spans
