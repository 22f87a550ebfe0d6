#!/usr/bin/env bash
# Call 3: D is branch attn-persist-diag (the persistent forward with two
# diagnostic switches: RLPIPE_DIAG_FWDP_THR=1 releases the ring a thread
# at a time as k_ws_fwd_* does, RLPIPE_DIAG_FWDP_GRID=all launches a CTA
# per item). The forward rows of BenchmarkOps under each, alternated.
set -u
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && RLPIPE_DIAG_FWDP_THR=1 RLPIPE_DIAG_FWDP_GRID=all timeout 120 ../../.devbin/D/cuda.test -test.run 'TestAttentionTensorCore' >"$R/tests.log" 2>&1)
say "D tests (thr, grid all) rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests.log" | tr '\n' ' ')"
for rep in 1 2; do
for v in "" "THR=1" "GRID=all" "THR=1 GRID=all"; do
	env=()
	for kv in $v; do env+=("RLPIPE_DIAG_FWDP_$kv"); done
	(cd gpu/cuda && env "${env[@]}" timeout 100 ../../.devbin/D/cuda.test -test.run '^$' -test.bench 'Ops/attention_fwd_(8x2048|2x16384)_h12/2_d128_ws' -test.benchtime 20x >"$R/bench-$rep-${v// /_}.log" 2>&1)
	say "[$v] rep $rep rc=$?"
	grep -E 'attention_fwd' "$R/bench-$rep-${v// /_}.log" | awk '{print $1, $3, $4, $5}' | while read -r l; do say "  $l"; done
done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
