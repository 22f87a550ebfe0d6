#!/usr/bin/env bash
# Call 6 (one H200): the host's turn in the train step's head. Build diag:
# main at 20d1350 with stages/train.go's chunkGrads timing itself (a Sync
# first, then the time until it returns: the downloads of the chunk's
# log-probs and entropies, the loss gradients, their uploads), printed a
# micro-batch at a time ("DIAG" lines); not committed. rlbench 3B and 1.5B.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
say "profilers: $(command -v nsys ncu 2>/dev/null | tr '\n' ' ')"
mkdir -p "$OUT/rb"
for m in qwen2.5-3b qwen2.5-1.5b; do
	timeout 150 .devbin/diag/rlbench --backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 3 --out "$OUT/rb/$m.json" >"$OUT/rb/$m.log" 2>&1
	say "$m: rc=$? $(tail -1 "$OUT/rb/$m.log") at ${SECONDS}s"
	grep DIAG "$OUT/rb/$m.log" | tee -a "$OUT/summary.txt"
done
(cd "$OUT" && tar czf r.tgz rb; rm -rf rb)
