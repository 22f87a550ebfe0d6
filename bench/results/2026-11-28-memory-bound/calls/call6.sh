#!/usr/bin/env bash
# Call 6 (one H200): build 13, Qwen2.5-7B (untied: its head and embedding
# grads stay raw too, and the plan recomputes layers 0-9 instead of 0-10)
# with RLPIPE_RAW_GRADS 1 and 0, alternated while the budget lasts.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
mkdir -p "$OUT/rb"
run() { # raw round
	local k=$1 r=$2
	RLPIPE_RAW_GRADS=$k timeout 240 .devbin/13/rlbench --backend cuda --config examples/models/qwen2.5-7b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 2 --out "$OUT/rb/7b-raw$k-$r.json" >"$OUT/rb/7b-raw$k-$r.log" 2>&1
	say "7B raw=$k round $r: rc=$? $(tail -1 "$OUT/rb/7b-raw$k-$r.log") at ${SECONDS}s"
	grep 'recompute of' "$OUT/rb/7b-raw$k-$r.log" | tee -a "$OUT/summary.txt"
}
run 1 1
run 0 1
if ((SECONDS < 380)); then
	run 1 2
	run 0 2
fi
(cd "$OUT" && tar czf r.tgz rb 2>/dev/null; rm -rf rb)
