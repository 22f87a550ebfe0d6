#!/usr/bin/env bash
# Call 5 (one H200): build p, the one-pass backward reworked so that its
# consumers never wait for each other once a tile: each tile's dS goes
# through one of two buffers with "ready" and "free" mbarriers, and a
# tile's dq product is issued in the next tile. The one-pass and attention
# tests, then BenchmarkAttention's backward rows (two-pass and one-pass in
# the same binary) at the default shapes, twice.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/t"
(cd gpu/cuda && timeout 200 ../../.devbin/p/cuda.test -test.v -test.timeout 190s -test.run 'TestAttentionOnePass|TestAttentionTensorCore' >"$OUT/t/tests.log" 2>&1)
say "tests rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|PASS|FAIL)|not the same|dq:|panic' "$OUT/t/tests.log" | head -30 | tee -a "$OUT/summary.txt"
for r in 1 2; do
	(cd gpu/cuda && timeout 150 ../../.devbin/p/cuda.test -test.run '^$' -test.bench 'BenchmarkAttention/bwd' -test.benchtime 20x >"$OUT/t/bench-$r.log" 2>&1)
	say "round $r rc=$?"
	grep -E 'ns/op' "$OUT/t/bench-$r.log" | sed 's/BenchmarkAttention\///' | awk '{print $1, $3/1000 " us", $5, $6}' | tee -a "$OUT/summary.txt"
done
say "at ${SECONDS}s"
(cd "$OUT" && tar czf r.tgz t 2>/dev/null; rm -rf t)
