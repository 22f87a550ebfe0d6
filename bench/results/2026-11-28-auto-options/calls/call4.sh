#!/usr/bin/env bash
# Call 4: the offloaded step in updates of two micro-batches against the
# PyTorch FSDP2 peer with gradient accumulation (peer_fsdp2.py
# --micro-batches 2, under CPUOffloadPolicy, without activation
# checkpointing first): bench/offload_device.sh with OFFLOAD_MICRO=2, at
# 1.5B and 3B, rlpipe's options left to auto, and its resident run. First
# the peer's CPU smoke test, which checks that two micro-batches give the
# update of one.
set -u
tar xzf .devbin/b.tgz -C .devbin
nvidia-smi -L >"$OUT/env.txt"; nproc >>"$OUT/env.txt"
timeout 90 python3 bench/peer_smoke.py >"$OUT/peer_smoke.txt" 2>&1
echo "peer smoke rc=$?" | tee -a "$OUT/summary.txt"
OUT=$OUT/off OFFLOAD_MICRO=2 OFFLOAD_RUNS="overlap peer resident" OFFLOAD_BUDGET_S=460 bash bench/offload_device.sh >>"$OUT/summary.txt" 2>&1
