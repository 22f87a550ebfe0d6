#!/usr/bin/env bash
# The gate/up product with SwiGLU in its epilogue (k_gemm_swiglu_*), in one
# device call on one H100: the kernels compile, the fused op agrees with
# the CPU's two products and SwiGLU, its speed against two cuBLASLt
# products and a SwiGLU (BenchmarkOps) and where its time goes (ncu), and
# the 3B ref_logprob with the kernel on, off (RLPIPE_CUDA_GEMM_SWIGLU=0) and
# in its 96-column form (=96) and in clusters of two (=mc), alternated
# (GS_STEP_VARIANTS). Build first:
#
#   go build -ldflags='-s -w' -o .devbin/rlbench ./bench/cmd/rlbench
#   go test -c -ldflags='-s -w' -o .devbin/cuda.test ./gpu/cuda
#
# Writes summary.txt and r.tgz (logs, JSON) to $OUT.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gemm-swiglu-out}
R=$OUT/r
mkdir -p "$R"
B=$PWD/.devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && timeout 240 "$B/cuda.test" -test.run 'TestKernelsCompile|TestGateUpSwiGLU|TestAttentionTensorCore|TestAttentionSpans|TestElementwise' -test.v >"$R/tests.log" 2>&1)
say "tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests.log" | tr '\n' ' ')"
if [ -x "$B/stages.test" ]; then
	(cd stages && timeout 120 "$B/stages.test" -test.run 'TestRunTinyCUDA$|TestGateUpFused' -test.v >"$R/stages.log" 2>&1)
	say "stages tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/stages.log" | tr '\n' ' ')"
fi
(cd gpu/cuda && timeout 60 "$B/cuda.test" -test.run '^$' -test.bench 'Ops/(gemm_bf16|gate|swiglu_fwd)' -test.benchtime 20x >"$R/bench.log" 2>&1)
# Qwen2.5-3B's shapes, random operands.
(cd gpu/cuda && timeout 90 "$B/cuda.test" -test.run '^$' -test.bench 'GateUpSwiGLU' -test.benchtime 20x >>"$R/bench.log" 2>&1)
grep Benchmark "$R/bench.log" | tee -a "$OUT/summary.txt"
# Where the fused kernel's time goes, beside cuBLASLt's product (ncu).
if command -v ncu >/dev/null; then
	(cd gpu/cuda && timeout 150 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
		--section WarpStateStats --section SchedulerStats --kernel-name regex:'gemm_swiglu|nvjet' --launch-count 20 \
		"$B/cuda.test" -test.run '^$' -test.bench 'GateUpSwiGLU/(products|fused)' -test.benchtime 2x >"$R/ncu.log" 2>&1)
	say "ncu rc=$?"
fi
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
steps=${GS_STEP_VARIANTS-1 mc 96 0 1 mc 96}
# A kernel that failed its tests (or hung: timeout) does not run the step.
grep -q '^PASS' "$R/tests.log" || { steps="0 0"; say "tests failed: the step runs unfused only"; }
for v in $steps; do
	i=$((i + 1))
	RLPIPE_CUDA_GEMM_SWIGLU=$v timeout 200 "$B/rlbench" "${W[@]}" --out "$R/3b-fused$v-$i.json" >"$R/3b-fused$v-$i.log" 2>&1
	say "3b fused=$v run $i rc=$? $(tail -n 1 "$R/3b-fused$v-$i.log")"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
