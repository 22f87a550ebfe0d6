#!/usr/bin/env bash
# Call 4 (one H200): the log-prob head's row statistics. Builds: base is
# main at 2a15028 with BenchmarkLogProbsHead's new row (k_lp_fwd alone);
# t1, t1u8, fexp, noexp are base with calls/lpvar.py's forms of
# kernels/logprobs.cu (t1, t1+u8, fexp, noexp). TestLogProbs* on t1 and
# t1u8; then the head benchmark's step rows at the 3B and 1.5B shapes,
# the builds alternated twice.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/ops"
for v in t1 t1u8; do
	(cd gpu/cuda && timeout 120 ../../.devbin/$v/cuda.test -test.run 'TestLogProbs' -test.v) >"$OUT/ops/test-$v.txt" 2>&1
	say "tests $v: rc=$? at ${SECONDS}s"
	grep -E '^(--- |ok|FAIL|PASS)' "$OUT/ops/test-$v.txt" | tee -a "$OUT/summary.txt"
done
i=0
for r in 1 2; do
	for v in base t1 t1u8 fexp noexp; do
		i=$((i + 1))
		for shp in 2048,2048,151936 2048,1536,151936; do
			f="$OUT/ops/lp$i-$v-${shp//,/x}.txt"
			(cd gpu/cuda && RLPIPE_BENCH_LP=$shp timeout 90 ../../.devbin/$v/cuda.test -test.run '^$' -test.bench 'LogProbsHead/step:_(k_lp|logits_\+|logits_backward)' -test.benchtime 20x) >"$f" 2>&1
			say "lp $v $shp: rc=$? at ${SECONDS}s"
			grep -E '^Benchmark' "$f" | tee -a "$OUT/summary.txt"
		done
	done
done
(cd "$OUT" && tar czf r.tgz ops; rm -rf ops)
