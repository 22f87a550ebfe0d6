#!/usr/bin/env bash
# Seconds to the first step of the 1.5B run, before and after a change, and
# transformers loading the same checkpoint, in one call on one GPU:
# rlbench (setup_s, and setup_stages: each setup stage synced at its end)
# twice per binary, alternating, from a warm page cache, then
# bench/load_peer.py. Build first:
#
#   go build -ldflags='-s -w' -o .devbin/rlbench ./bench/cmd/rlbench
#   (cd OLD_CHECKOUT && go build -ldflags='-s -w' -o .devbin/rlbench-before ./bench/cmd/rlbench)
#
# JSON to $OUT, logs tarred into $OUT/logs.tgz.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/setup-out}
mkdir -p "$OUT"
C=${RLBENCH_CACHE:-/tmp/rbc}
A=(--config examples/models/qwen2.5-1.5b --backend cuda --steps 1 --warmup 0 --seqs 8 --tokens-per-seq 2048
	--prompt-tokens 64 --chunk 2048 --precision bf16 --recompute --cache "$C")
i=0
for r in before:rlbench-before after:rlbench before:rlbench-before after:rlbench; do
	n=${r%%:*} b=${r#*:}
	i=$((i + 1))
	[[ -x .devbin/$b ]] || continue
	timeout 200 ".devbin/$b" "${A[@]}" --out "$OUT/$i-$n.json" >"$OUT/$i-$n.log" 2>&1
	echo "$i $n rc=$? $(python3 -c "import json; d=json.load(open('$OUT/$i-$n.json')); print(round(d['setup_s'],2), [(s['stage'], round(s['seconds'],2)) for s in d['setup_stages']])" 2>&1 | tail -1)"
done
python3 bench/load_peer.py "$(ls -d "$C"/*/ | head -1)" --out "$OUT/peer-load.json" 2>&1 | tail -1
(cd "$OUT" && tar czf logs.tgz ./*.log && rm ./*.log)
