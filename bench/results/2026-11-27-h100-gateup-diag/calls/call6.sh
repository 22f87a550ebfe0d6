#!/usr/bin/env bash
# Call 6: P is branch in-place (94e0fa1: on one rank the frozen ref's
# units are read in place, only the fused q/k/v span copied; main's
# e487ebc below it). P's CUDA stage tests (TestRunTinyCUDA, sleep/wake)
# and TestInPlace*; the 3B step with the default (in place) and
# RLPIPE_GATHER_IN_PLACE=0 (whole units copied, as before), alternated,
# three rounds; a timeline of P.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd stages && timeout 300 ../.devbin/P/stages.test -test.run 'TestRunTinyCUDA$|TestSleepWakeCUDA|TestInPlace' -test.v >"$R/stages.log" 2>&1)
say "P stage tests rc=$? $(grep -E '^(--- FAIL|--- PASS|--- SKIP|FAIL|PASS|ok)' "$R/stages.log" | tr '\n' ' ')"
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 4 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for rep in 1 2 3; do
	for m in copy place; do
		i=$((i + 1))
		v=1
		[[ $m == copy ]] && v=0
		RLPIPE_GATHER_IN_PLACE=$v timeout 150 .devbin/P/rlbench "${W[@]}" --out "$R/3b-$m-$i.json" >"$R/3b-$m-$i.log" 2>&1
		say "3b $m run $i rc=$? $(tail -n 1 "$R/3b-$m-$i.log")"
	done
done
W[13]=1 W[15]=2
timeout 150 .devbin/P/rlbench "${W[@]}" --out "$R/tl.json" --timeline "$R/3b.trace.json" >"$R/tl.log" 2>&1
say "timeline rc=$? $(tail -n 1 "$R/tl.log")"
python3 bench/trace_ops.py "$R/3b.trace.json" --top 14 >"$R/ops.txt" 2>&1
head -30 "$R/ops.txt" >>"$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
