#!/usr/bin/env bash
# Call 9 (one H200). Builds: b1 is main at 49fbc5f; lp is b1 with the
# log-prob kernels' weights summed in float32 over each group of (up to)
# four values a thread takes, those sums in float64.
# 1. gpu/cuda's log-prob tests and the model package's tests (HF parity on
#    CUDA among them) on lp;
# 2. BenchmarkLogProbsHead at the 3B and 1.5B shapes, b1 and lp alternated;
# 3. rlbench 3B and 1.5B, b1 and lp alternated.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
(cd gpu/cuda && timeout 120 ../../.devbin/lp/cuda.test -test.run 'TestLogProbs|TestKernelNames' -test.v) >"$OUT/cuda-tests.log" 2>&1
say "gpu/cuda log-prob tests (lp): rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)' "$OUT/cuda-tests.log" | tee -a "$OUT/summary.txt"
(cd model && timeout 200 ../.devbin/lp/model.test -test.v) >"$OUT/model-tests.log" 2>&1
say "model tests (lp, CUDA and CPU): rc=$? at ${SECONDS}s"
grep -E '^(--- FAIL|FAIL|ok|PASS)' "$OUT/model-tests.log" | tee -a "$OUT/summary.txt"
grep -c -- '--- PASS' "$OUT/model-tests.log" | sed 's/^/passed: /' | tee -a "$OUT/summary.txt"
mkdir -p "$OUT/ops" "$OUT/rb"
for r in 1 2; do
	for v in b1 lp; do
		for shp in 2048,2048,151936 2048,1536,151936; do
			(cd gpu/cuda && RLPIPE_BENCH_LP=$shp timeout 120 ../../.devbin/$v/cuda.test -test.run '^$' -test.bench LogProbsHead -test.benchtime 20x) >"$OUT/ops/lp-$v-$r-$shp.txt" 2>&1
			say "LogProbsHead $v $r $shp: rc=$? at ${SECONDS}s"
			grep -E '^Benchmark' "$OUT/ops/lp-$v-$r-$shp.txt" | tee -a "$OUT/summary.txt"
		done
	done
done
run() { # build model round
	timeout 100 .devbin/$1/rlbench --backend cuda --config examples/models/$2/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 3 --out "$OUT/rb/$2-$1-$3.json" >"$OUT/rb/$2-$1-$3.log" 2>&1
	say "$2 $1 round $3: rc=$? $(tail -1 "$OUT/rb/$2-$1-$3.log") at ${SECONDS}s"
}
run lp qwen2.5-3b 1
run b1 qwen2.5-3b 1
run lp qwen2.5-1.5b 1
run b1 qwen2.5-1.5b 1
(cd "$OUT" && tar czf r.tgz ops rb model-tests.log 2>/dev/null; rm -rf ops rb model-tests.log)
