#!/usr/bin/env bash
# Call 5 (one H200): where the train step's log-prob head spends its time.
# Build h: main at 20d1350 with BenchmarkLogProbsHead's train-step rows.
# BenchmarkLogProbsHead at the 3B and 1.5B shapes (2048-row chunks), then
# BenchmarkGemmAlgos at the 3B dimensions (cuBLASLt's candidates for every
# product of the step).
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/ops"
for shp in 2048,2048,151936 2048,1536,151936; do
	(cd gpu/cuda && RLPIPE_BENCH_LP=$shp timeout 120 ../../.devbin/h/cuda.test -test.run '^$' -test.bench LogProbsHead -test.benchtime 20x) >"$OUT/ops/lp-$shp.txt" 2>&1
	say "LogProbsHead $shp: rc=$? at ${SECONDS}s"
	grep -E '^Benchmark' "$OUT/ops/lp-$shp.txt" | tee -a "$OUT/summary.txt"
done
(cd gpu/cuda && RLPIPE_BENCH_GEMM_DIMS=2048,11008,256 timeout 300 ../../.devbin/h/cuda.test -test.run '^$' -test.bench GemmAlgos -test.benchtime 10x) >"$OUT/ops/algos-3b.txt" 2>&1
say "GemmAlgos 3B: rc=$? at ${SECONDS}s"
grep -E '^Benchmark' "$OUT/ops/algos-3b.txt" | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz ops; rm -rf ops)
