#!/usr/bin/env bash
# Call 7 (one H200): what bounds the two-pass backward's dk/dv kernel.
# Diagnostic builds of main (b0441d4), each with wrong results: nomath
# (the scores and dP taken as P and dS, no softmax or masking), nors (no
# dV and dK products), noss (no S and dP products: constants instead);
# base is main. BenchmarkAttention's backward rows (both passes) at
# 8 × 2048 and 2 × 8192 (3B heads) and BenchmarkOps' dk/dv and dq pass
# rows (8 × 2048, 12/2 heads), the builds alternated twice.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/t"
for r in 1 2; do
	for v in base nomath nors noss; do
		(cd gpu/cuda && RLPIPE_BENCH_ATTN="8x2048/16/2/128 2x8192/16/2/128" timeout 100 ../../.devbin/$v/cuda.test -test.run '^$' -test.bench 'BenchmarkAttention/bwd|BenchmarkOps/attention_bwd_8x2048_h12/2_d128_d' -test.benchtime 20x >"$OUT/t/bench-$v-$r.log" 2>&1)
		say "$v round $r rc=$?"
		grep -E 'ns/op' "$OUT/t/bench-$v-$r.log" | sed 's/Benchmark//' | awk '{print $1, $3/1000 " us", $5, $6}' | tee -a "$OUT/summary.txt"
	done
done
say "at ${SECONDS}s"
(cd "$OUT" && tar czf r.tgz t 2>/dev/null; rm -rf t)
