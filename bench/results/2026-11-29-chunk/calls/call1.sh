#!/usr/bin/env bash
# Call 1 (one H200): the log-prob chunk against the step's speed. rlbench's
# GRPO step (8 × 2048 tokens, bf16, recompute auto) at 1.5B and 3B with
# --chunk 2048, 4096, 8192 and 0 (chunk_tokens auto: the largest chunk that
# fits, here the whole micro-batch of 16384 rows), each once, then 2048 and
# 4096 again at 1.5B.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
B=.devbin/c1
one() { # NAME MODEL CHUNK
	timeout 100 $B/rlbench --backend cuda --config "examples/models/$2/config.json" --seqs 8 --tokens-per-seq 2048 \
		--prompt-tokens 64 --chunk $3 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q \
		--out "$OUT/r/$1.json" >"$OUT/r/$1.log" 2>&1
	say "$1 rc=$? at ${SECONDS}s: $(tail -n 1 "$OUT/r/$1.log" | cut -c1-260)"
}
for c in 2048 4096 8192 0; do one 15b-c$c qwen2.5-1.5b $c; done
for c in 2048 4096 0; do ((SECONDS < 430)) && one 3b-c$c qwen2.5-3b $c; done
for c in 2048 4096; do ((SECONDS < 520)) && one 15b-c$c-2 qwen2.5-1.5b $c; done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
