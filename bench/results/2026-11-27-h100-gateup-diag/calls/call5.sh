#!/usr/bin/env bash
# Call 5: M is main (69af574), S1 branch stage-stmatrix (e487ebc), T is
# S1 + RLPIPE_DIAG_GATHER_TWICE (branch gather-twice-diag, a9fdc98: every
# one-rank gather copied twice, with the switch set). The 3B step, M, S1
# and T alternated, three rounds; then a timeline of S1.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 4 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for rep in 1 2 3; do
	for b in M S1 T; do
		i=$((i + 1))
		case $b in
		T) env RLPIPE_DIAG_GATHER_TWICE=1 timeout 150 .devbin/S1/rlbench-twice "${W[@]}" --out "$R/3b-$b-$i.json" >"$R/3b-$b-$i.log" 2>&1 ;;
		*) timeout 150 .devbin/$b/rlbench "${W[@]}" --out "$R/3b-$b-$i.json" >"$R/3b-$b-$i.log" 2>&1 ;;
		esac
		say "3b $b run $i rc=$? $(tail -n 1 "$R/3b-$b-$i.log")"
	done
done
W[13]=1 W[15]=2
timeout 150 .devbin/S1/rlbench "${W[@]}" --out "$R/tl.json" --timeline "$R/3b.trace.json" >"$R/tl.log" 2>&1
say "timeline rc=$? $(tail -n 1 "$R/tl.log")"
python3 bench/trace_ops.py "$R/3b.trace.json" --top 14 >"$R/ops.txt" 2>&1
head -40 "$R/ops.txt" >>"$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
