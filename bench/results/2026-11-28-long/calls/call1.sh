#!/usr/bin/env bash
# Call 1 (one H200): rlpipe's attention against PyTorch's
# scaled_dot_product_attention, kernel against kernel
# (bench/attn_peer_device.sh, its default shapes: 16384 tokens as 8 × 2048,
# 2 × 8192 and 1 × 16384 at the 3B's heads, 8 × 2048 at the 1.5B's and
# 0.5B's); then best against best at 3B on 2 sequences of 8192 tokens
# (the same 16384 tokens a step as the 8 × 2048 benchmark), the peer
# compiled with and without activation checkpointing; then rlbench's
# timeline of that step. Build n: main with BenchmarkAttention.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/n/cuda.test .devbin/cuda.test
cp .devbin/n/rlbench .devbin/rlbench
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
{
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
	python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "cudnn", torch.backends.cudnn.version())'
} >"$OUT/env.txt" 2>&1
OUT=$OUT/attn ATTN_BUDGET_S=240 bash bench/attn_peer_device.sh >"$OUT/attn.log" 2>&1
cat "$OUT/attn/table.md" | tee -a "$OUT/summary.txt"
say "at ${SECONDS}s"
OUT=$OUT/f3 FAIR_MODELS=qwen2.5-3b FAIR_SEQS=2 FAIR_TOKENS=8192 FAIR_RUNS="auto peer-noac-compile peer-ac-compile" FAIR_BUDGET_S=$((520 - SECONDS)) bash bench/fair_device.sh >"$OUT/fair3.log" 2>&1
grep -E 'rc=|best against best|\| shared' "$OUT/fair3.log" | tee -a "$OUT/summary.txt"
say "at ${SECONDS}s"
if ((SECONDS < 500)); then
	timeout $((585 - SECONDS)) .devbin/rlbench --backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 2 --tokens-per-seq 8192 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 1 --precision bf16 --recompute-auto --cache /tmp/rbc --timeline "$OUT/3b-long.trace.json" --out "$OUT/3b-long.json" >"$OUT/3b-long.log" 2>&1
	say "timeline rc=$? at ${SECONDS}s"
fi
rm -rf "$OUT"/f3/work-*
(cd "$OUT" && tar czf r.tgz attn f3 fair3.log attn.log 3b-long.* 2>/dev/null; rm -rf attn f3 fair3.log attn.log 3b-long.*)
