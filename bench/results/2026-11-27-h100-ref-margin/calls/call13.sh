#!/usr/bin/env bash
# Call 13: X is branch gather-copy-diag (main fa05906 + a diagnostic:
# RLPIPE_DIAG_SKIP_GATHER_COPY=1 stops the one-rank gathers' device copies
# after the first 200 slot copies, so that later forwards run on stale but
# real weights). The 3B step with the copies and without, alternated: an
# upper bound on what viewing the shard in place would save.
set -u
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 4 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for v in 0 1 0 1; do
	i=$((i + 1))
	RLPIPE_DIAG_SKIP_GATHER_COPY=$v timeout 150 .devbin/X/rlbench "${W[@]}" --out "$R/3b-skip$v-$i.json" >"$R/3b-skip$v-$i.log" 2>&1
	say "3b skip=$v run $i rc=$? $(tail -n 1 "$R/3b-skip$v-$i.log")"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
