#!/usr/bin/env bash
# recompute auto and chunk_tokens auto against hand-picked settings on the
# 1.5B bench workload (8 x 2048 tokens, bf16), one GPU, one call. Build
# first: go build -ldflags='-s -w' -o .devbin/rlbench ./bench/cmd/rlbench
# JSON to $OUT, logs tarred into $OUT/logs.tgz.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/auto-out}
mkdir -p "$OUT"
C=${RLBENCH_CACHE:-/tmp/rbc}
A=(--config examples/models/qwen2.5-1.5b --backend cuda --warmup 1 --steps 3 --seqs 8 --tokens-per-seq 2048
	--prompt-tokens 64 --precision bf16 --cache "$C")
run() { # NAME ARGS...
	local n=$1
	shift
	timeout 150 .devbin/rlbench "${A[@]}" "$@" --out "$OUT/$n.json" >"$OUT/$n.log" 2>&1
	echo "$n rc=$? $(tail -n 1 "$OUT/$n.log" | cut -c1-300)"
}
run recompute-c2048 --recompute --chunk 2048
run none-c2048 --recompute=false --chunk 2048
run auto-c2048 --recompute-auto --chunk 2048
run auto-cauto --recompute-auto --chunk 0
run none-c8192 --recompute=false --chunk 8192
(cd "$OUT" && tar czf logs.tgz ./*.log && rm ./*.log)
