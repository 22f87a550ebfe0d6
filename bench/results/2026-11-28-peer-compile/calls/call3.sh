#!/usr/bin/env bash
# Call 3 (H100): the offloaded step against the peer eager and compiled
# (peer_fsdp2.py --compile layers), at 3B then 1.5B, with rlpipe resident
# for the offloaded step's cost; one offload_device.sh. Build 1.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/1/rlbench .devbin/rlbench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt"
OUT=$OUT/o OFFLOAD_MODELS="qwen2.5-3b qwen2.5-1.5b" OFFLOAD_RUNS="overlap peer peer-compile resident" OFFLOAD_BUDGET_S=560 bash bench/offload_device.sh >"$OUT/offload.log" 2>&1
rm -rf "$OUT/o"/work-*
grep -E 'rc=|x,|x$' "$OUT/offload.log" | tee "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz o offload.log && rm -rf o)
