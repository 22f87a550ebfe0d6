#!/usr/bin/env bash
# The gate/up product with SwiGLU in its epilogue (k_gemm_swiglu_*), in one
# device call on one H100: the kernels compile, the fused op agrees with
# the CPU's two products and SwiGLU (and the CUDA stages with the CPU's),
# its speed against two cuBLASLt products and a SwiGLU at three models'
# shapes with pseudo-random operands (BenchmarkGateUpSwiGLU), and the 3B
# ref_logprob with the kernel on and off (RLPIPE_CUDA_GEMM_SWIGLU=0),
# alternated (GS_STEP_VARIANTS). Build first:
#
#   go build -ldflags='-s -w' -o .devbin/rlbench ./bench/cmd/rlbench
#   go test -c -ldflags='-s -w' -o .devbin/cuda.test ./gpu/cuda
#   go test -c -ldflags='-s -w' -o .devbin/stages.test ./stages   # optional
#
# GS_NCU=1 adds ncu's sections on the fused kernel and cuBLASLt's products
# at 3B shapes. Writes summary.txt and r.tgz (logs, JSON) to $OUT.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gemm-swiglu-out}
R=$OUT/r
mkdir -p "$R"
B=$PWD/.devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && timeout 240 "$B/cuda.test" -test.run 'TestKernelsCompile|TestGateUpSwiGLU|TestElementwise' -test.v >"$R/tests.log" 2>&1)
say "tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests.log" | tr '\n' ' ')"
if [ -x "$B/stages.test" ]; then
	(cd stages && timeout 150 "$B/stages.test" -test.run 'TestRunTinyCUDA$|TestGateUpFused' -test.v >"$R/stages.log" 2>&1)
	say "stages tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/stages.log" | tr '\n' ' ')"
fi
# Qwen2.5-3B's, 1.5B's and 0.5B's shapes at 16384 tokens.
for s in 16384,2048,11008 16384,1536,8960 16384,896,4864; do
	(cd gpu/cuda && RLPIPE_BENCH_GATE_UP=$s timeout 100 "$B/cuda.test" -test.run '^$' -test.bench 'GateUpSwiGLU' -test.benchtime 20x >>"$R/bench.log" 2>&1)
done
grep Benchmark "$R/bench.log" | tee -a "$OUT/summary.txt"
if [ "${GS_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
	(cd gpu/cuda && timeout 150 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
		--section WarpStateStats --section SchedulerStats --kernel-name regex:'gemm_swiglu|nvjet' --launch-count 12 \
		"$B/cuda.test" -test.run '^$' -test.bench 'GateUpSwiGLU/(products|fused)' -test.benchtime 2x >"$R/ncu.log" 2>&1)
	say "ncu rc=$?"
fi
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
steps=${GS_STEP_VARIANTS-1 0 1 0}
# A kernel that failed its tests (or hung: timeout) does not run the step.
grep -q '^PASS' "$R/tests.log" || { steps="0"; say "tests failed: the step runs unfused only"; }
for v in $steps; do
	i=$((i + 1))
	RLPIPE_CUDA_GEMM_SWIGLU=$v timeout 200 "$B/rlbench" "${W[@]}" --out "$R/3b-fused$v-$i.json" >"$R/3b-fused$v-$i.log" 2>&1
	say "3b fused=$v run $i rc=$? $(tail -n 1 "$R/3b-fused$v-$i.log")"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
