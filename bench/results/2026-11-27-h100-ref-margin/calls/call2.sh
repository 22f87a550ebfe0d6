#!/usr/bin/env bash
# Call 2: P is the persistent attention forward (k_ws_fwdp_*; build
# named in the README). Its tests with ptxas's report; BenchmarkOps'
# forward rows (a CTA a block against persistent); the 3B step with
# RLPIPE_CUDA_FWD_PERSIST=0 and 1 alternated on P's binary.
set -u
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && RLPIPE_CUDA_COMPILE_LOG=1 timeout 200 ../../.devbin/P/cuda.test -test.run 'TestAttentionTensorCore|TestAttentionSpans|TestTensorCoreLaunch' -test.v >"$R/tests.log" 2>&1)
say "P tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests.log" | tr '\n' ' ')"
grep -A4 "entry function 'k_ws_fwdp_bf16_128'" "$R/tests.log" | grep -iE 'Used|spill' | head -4 | while read -r l; do say "ptxas: $l"; done
grep -iE 'serializ|WG\.AR' "$R/tests.log" | sort | uniq -c | head -5 | while read -r l; do say "ptxas: $l"; done
(cd gpu/cuda && timeout 200 ../../.devbin/P/cuda.test -test.run '^$' -test.bench 'Ops/attention_fwd_(8x2048|2x16384)' -test.benchtime 20x >"$R/bench.log" 2>&1)
say "bench rc=$?"
grep -E 'attention_fwd' "$R/bench.log" | awk '{print $1, $3, $4, $5, $6, $7, $8}' | while read -r l; do say "$l"; done
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 4 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for p in 0 1 0 1; do
	i=$((i + 1))
	RLPIPE_CUDA_FWD_PERSIST=$p timeout 150 .devbin/P/rlbench "${W[@]}" --out "$R/3b-p$p-$i.json" >"$R/3b-p$p-$i.log" 2>&1
	say "3b persist=$p run $i rc=$? $(tail -n 1 "$R/3b-p$p-$i.log")"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
