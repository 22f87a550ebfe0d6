#!/usr/bin/env bash
# Call 3 (one H200): the one-pass backward with call 2's bug mended (a
# consumer's dS rows were written 64 rows too low) and reworked: two dS
# buffers, one meeting of the consumers a tile, Q and dout in two buffers.
# Builds o (it waits for the dk and dv products before the dq one) and d
# (defer: the dq product is issued beside them, one wait for the three).
# For each: the one-pass tests, then BenchmarkAttention's backward rows,
# the builds alternated twice.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/t"
for v in o d; do
	(cd gpu/cuda && timeout 150 ../../.devbin/$v/cuda.test -test.v -test.timeout 140s -test.run 'TestAttentionOnePass' >"$OUT/t/tests-$v.log" 2>&1)
	say "$v tests rc=$? at ${SECONDS}s"
	grep -E '^(--- |ok|PASS|FAIL)|not the same|dq:|panic' "$OUT/t/tests-$v.log" | head -20 | tee -a "$OUT/summary.txt"
done
for r in 1 2; do
	for v in o d; do
		(cd gpu/cuda && timeout 120 ../../.devbin/$v/cuda.test -test.run '^$' -test.bench 'BenchmarkAttention/bwd' -test.benchtime 20x >"$OUT/t/bench-$v-$r.log" 2>&1)
		say "$v round $r rc=$?"
		grep -E 'ns/op' "$OUT/t/bench-$v-$r.log" | sed 's/BenchmarkAttention\///' | awk '{print $1, $3/1000 " us", $5, $6}' | tee -a "$OUT/summary.txt"
	done
done
say "at ${SECONDS}s"
(cd "$OUT" && tar czf r.tgz t 2>/dev/null; rm -rf t)
