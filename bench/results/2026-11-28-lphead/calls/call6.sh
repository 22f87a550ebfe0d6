#!/usr/bin/env bash
# Call 6 (one H200), build c6 (main at 4e24ae5's rlbench) with the working
# tree's bench/device_lib.sh and bench/smi_summary.py: best against best at
# 1.5B (bench/fair_device.sh: rlpipe auto, the compiled peer with and
# without checkpointing), each run's GPU clock and power sampled (budgeted):
# do both sides run at the power cap, and at which clocks?
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/c6/rlbench .devbin/rlbench
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
OUT="$OUT/fair" FAIR_MODELS="qwen2.5-1.5b" FAIR_RUNS="auto peer-noac-compile peer-ac-compile" FAIR_BUDGET_S=300 \
	bash bench/fair_device.sh >"$OUT/fair.log" 2>&1
say "fair rc=$? at ${SECONDS}s"
grep -E 'best against best|rc=' "$OUT/fair.log" | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz fair fair.log && rm -rf fair fair.log)
