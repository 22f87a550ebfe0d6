#!/usr/bin/env bash
# Call 4 (one H200): where the one-pass backward (build o, call 3's) loses
# its time. Diagnostic builds of o, each with wrong dq: nored (no TMA
# addition of the staged sums), nodq (no dq product, staging or addition:
# the consumers still meet once a tile), nodqbar (none of wg_dq_add: the
# dk/dv pass with two Q and dout buffers and the dS stores). Their
# BenchmarkAttention backward rows at 8 × 2048 and 2 × 8192 (3B heads),
# alternated twice with o.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
which ncu nsys >>"$OUT/env.txt" 2>&1
mkdir -p "$OUT/t"
for r in 1 2; do
	for v in o nored nodq nodqbar; do
		(cd gpu/cuda && RLPIPE_BENCH_ATTN="8x2048/16/2/128 2x8192/16/2/128" timeout 120 ../../.devbin/$v/cuda.test -test.run '^$' -test.bench 'BenchmarkAttention/bwd' -test.benchtime 20x >"$OUT/t/bench-$v-$r.log" 2>&1)
		say "$v round $r rc=$?"
		grep -E 'ns/op' "$OUT/t/bench-$v-$r.log" | sed 's/BenchmarkAttention\///' | awk '{print $1, $3/1000 " us", $5, $6}' | tee -a "$OUT/summary.txt"
	done
done
say "at ${SECONDS}s"
(cd "$OUT" && tar czf r.tgz t 2>/dev/null; rm -rf t)
