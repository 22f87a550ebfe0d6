#!/usr/bin/env bash
# Call 9: T is branch attn-persist-store (the persistent forward, Q released after the wait, its output stored 16 bytes a lane by a quad transpose), rebased on main.
# Tests; the forward rows of BenchmarkOps as persistent and with a CTA per
# item (RLPIPE_DIAG_FWDP_GRID=all), twice; the 3B step with
# RLPIPE_CUDA_FWD_PERSIST=0 and 1 alternated.
set -u
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && RLPIPE_CUDA_COMPILE_LOG=1 timeout 120 ../../.devbin/T/cuda.test -test.run 'TestAttentionTensorCore' -test.v >"$R/tests.log" 2>&1)
say "T tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests.log" | tr '\n' ' ')"
grep -A4 "entry function 'k_ws_fwdp_bf16_128'" "$R/tests.log" | grep -iE 'Used|spill' | head -4 | while read -r l; do say "ptxas: $l"; done
for rep in 1 2; do
for v in "" "GRID=all"; do
	env=()
	for kv in $v; do env+=("RLPIPE_DIAG_FWDP_$kv"); done
	(cd gpu/cuda && env "${env[@]}" timeout 100 ../../.devbin/T/cuda.test -test.run '^$' -test.bench 'Ops/attention_fwd_(8x2048|2x16384)_h1[24]/2_d(128|64)_ws' -test.benchtime 20x >"$R/bench-$rep-${v// /_}.log" 2>&1)
	say "[$v] rep $rep rc=$?"
	grep -E 'attention_fwd' "$R/bench-$rep-${v// /_}.log" | awk '{print $1, $3, $4, $5}' | while read -r l; do say "  $l"; done
done
done
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 4 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for p in 0 1 0 1; do
	i=$((i + 1))
	RLPIPE_CUDA_FWD_PERSIST=$p timeout 150 .devbin/T/rlbench "${W[@]}" --out "$R/3b-p$p-$i.json" >"$R/3b-p$p-$i.log" 2>&1
	say "3b persist=$p run $i rc=$? $(tail -n 1 "$R/3b-p$p-$i.log")"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
