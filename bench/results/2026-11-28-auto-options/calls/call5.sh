#!/usr/bin/env bash
# Call 5: the peer's best configuration for updates of two micro-batches
# offloaded: FSDP2's gradient accumulation without communication
# (--grad-sync last: set_requires_gradient_sync(False) before all but the
# last micro-batch), without activation checkpointing, at 3B then 1.5B,
# from HF's random initialisation (timing only: call 4's rlbench
# checkpoints were on another machine). First the peer's CPU smoke test,
# mended (its stand-in builder lacked the weights argument).
set -u
nvidia-smi -L >"$OUT/env.txt"; nproc >>"$OUT/env.txt"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
timeout 60 python3 bench/peer_smoke.py >"$OUT/peer_smoke.txt" 2>&1
echo "peer smoke rc=$?" | tee -a "$OUT/summary.txt"
for m in qwen2.5-3b qwen2.5-1.5b; do
	timeout 100 python3 bench/peer_fsdp2.py --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 \
		--warmup 1 --steps 2 --offload --ac none --micro-batches 2 --grad-sync last --out "$OUT/peer-$m-last.json" >"$OUT/peer-$m-last.log" 2>&1
	echo "$m rc=$? $(tail -1 "$OUT/peer-$m-last.log")" | tee -a "$OUT/summary.txt"
done
