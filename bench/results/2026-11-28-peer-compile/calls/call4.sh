#!/usr/bin/env bash
# Call 4 (H100): best against best at 0.5B, the peer eager and compiled
# (peer_fsdp2.py --compile layers), one fair_device.sh. Build 1.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/1/rlbench .devbin/rlbench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt"
OUT=$OUT/f FAIR_MODELS=qwen2.5-0.5b FAIR_RUNS="auto peer-noac peer-ac peer-noac-compile peer-ac-compile" FAIR_BUDGET_S=300 bash bench/fair_device.sh >"$OUT/fair.log" 2>&1
rm -rf "$OUT/f"/work-*
grep -E 'rc=|best against best|\| shared' "$OUT/fair.log" | tee "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz f fair.log && rm -rf f)
