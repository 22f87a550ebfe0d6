#!/usr/bin/env bash
# Call 9: M is 587ad85; V (not kept unless it wins) is M with the attention
# forward's K/V ring at 3 buffers (WS_STAGES 3) and the fused log-prob
# head on 128 x 256 tiles with 4 buffers (LH_BN 256, LH_ST 4). V's tests;
# BenchmarkOps' forward row and BenchmarkLogProbsHead at 3B, M and V
# alternated; the 3B step, M and V alternated.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && timeout 200 ../../.devbin/V/cuda.test -test.run 'TestAttentionTensorCore|TestLogProbsFused|TestAttentionSpans' -test.v >"$R/v-tests.log" 2>&1)
say "V cuda tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/v-tests.log" | tr '\n' ' ')"
for b in M V M V; do
	(cd gpu/cuda && timeout 100 ../../.devbin/$b/cuda.test -test.run '^$' -test.bench 'Ops/attention_fwd_8x2048_h12/2_d128$' -test.benchtime 30x >"$R/ops.log" 2>&1)
	say "$b $(grep -E 'Benchmark|FAIL' "$R/ops.log" | tr '\n' ' ')"
	(cd gpu/cuda && RLPIPE_BENCH_LP=2048,2048,151936 timeout 100 ../../.devbin/$b/cuda.test -test.run '^$' -test.bench 'LogProbsHead' -test.benchtime 20x >"$R/lp.log" 2>&1)
	say "$b $(grep -E 'Benchmark|FAIL' "$R/lp.log" | tr '\n' ' ')"
done
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 4 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for b in M V M V; do
	i=$((i + 1))
	timeout 150 .devbin/$b/rlbench "${W[@]}" --out "$R/3b-$b-$i.json" >"$R/3b-$b-$i.log" 2>&1
	say "3b $b run $i rc=$? $(tail -n 1 "$R/3b-$b-$i.log")"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
