#!/usr/bin/env bash
# Call 5 (2×H200): best against best at dp 2, 1.5B, 8 sequences a GPU:
# rlbench --dp 2 (recompute auto) against the peer under
# torch.distributed.run, eager without checkpointing and compiled with and
# without it; one fair_device.sh with FAIR_DP=2. Build 1.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/1/rlbench .devbin/rlbench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt"
OUT=$OUT/f FAIR_DP=2 FAIR_MODELS=qwen2.5-1.5b FAIR_RUNS="auto peer-noac peer-noac-compile peer-ac-compile" FAIR_BUDGET_S=420 bash bench/fair_device.sh >"$OUT/fair.log" 2>&1
rm -rf "$OUT/f"/work-*
grep -E 'rc=|best against best|\| shared' "$OUT/fair.log" | tee "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz f fair.log && rm -rf f)
