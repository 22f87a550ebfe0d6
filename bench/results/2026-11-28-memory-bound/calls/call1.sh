#!/usr/bin/env bash
# Call 1 (one H200): build 11 (the norm backward's rows loaded ahead,
# k_adamw4, k_sumsq8, the optimizer's per-unit sums in one download) and
# build 10 (main at b2f927c, its cuda.test with build 11's perf_test.go).
# gpu/cuda's tests of the changed kernels and of the persistent products
# (whose tile counter zero4 clears, not run on a GPU before); the op
# benchmarks of the changed kernels, the builds alternated twice; the
# stages CUDA tests; then rlbench's 3B and 1.5B steps, the builds
# alternated, the first 3B run of build 11 with a timeline.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
(cd gpu/cuda && timeout 150 ../../.devbin/11/cuda.test -test.run 'TestFusedNorms|TestAdamWAndSumSquares|TestRMSNorm|TestVectorKernels|TestKernelNames|TestGateUpSwiGLU|TestDownSwiGLUBackward|TestTileQueue|TestQKVRoPE|TestLogProbsFused' -test.v) >"$OUT/cuda-tests.log" 2>&1
say "gpu/cuda tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)' "$OUT/cuda-tests.log" | tee -a "$OUT/summary.txt"
mkdir -p "$OUT/ops"
for r in 1 2; do
	for b in 10 11; do
		(cd gpu/cuda && timeout 60 ../../.devbin/$b/cuda.test -test.run '^$' -test.bench 'Ops/(rmsnorm_bwd|adamw|sumsquares)' -test.benchtime 50x) >"$OUT/ops/b$b-$r.txt" 2>&1
		say "ops build $b round $r: rc=$? at ${SECONDS}s"
		grep -E '^Benchmark' "$OUT/ops/b$b-$r.txt" | tee -a "$OUT/summary.txt"
	done
done
(cd stages && timeout 150 ../.devbin/11/stages.test -test.run 'CUDA' -test.v) >"$OUT/stages-cuda.log" 2>&1
say "stages CUDA tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|FAIL|PASS)' "$OUT/stages-cuda.log" | tee -a "$OUT/summary.txt"
mkdir -p "$OUT/rb"
run() { # build model round [extra...]
	local b=$1 m=$2 r=$3
	shift 3
	timeout 100 .devbin/$b/rlbench --backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 3 --out "$OUT/rb/$m-b$b-$r.json" "$@" >"$OUT/rb/$m-b$b-$r.log" 2>&1
	say "$m build $b round $r: rc=$? $(tail -1 "$OUT/rb/$m-b$b-$r.log") at ${SECONDS}s"
}
run 11 qwen2.5-3b 1 --timeline "$OUT/rb/3b-b11.trace.json"
run 10 qwen2.5-3b 1 --timeline "$OUT/rb/3b-b10.trace.json"
run 11 qwen2.5-3b 2
run 10 qwen2.5-3b 2
for r in 1 2; do
	if ((SECONDS < 500)); then
		run 11 qwen2.5-1.5b $r
		run 10 qwen2.5-1.5b $r
	fi
done
(cd "$OUT" && tar czf r.tgz ops rb stages-cuda.log cuda-tests.log 2>/dev/null; rm -rf ops rb stages-cuda.log)
