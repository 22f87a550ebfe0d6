#!/usr/bin/env bash
# Call 4 (one H200): energy a step, read outside the timed windows. Best
# against best at 1.5B and 3B (bench/fair_device.sh: rlpipe auto, the
# compiled peer with and without AC) with 12 timed steps a run: both sides
# read NVML's energy counter at the end of the last warm-up step and of
# the last timed one (rlbench once over its steps, the peer once per
# phase); compare.py's energy table in fair/best.md.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/e4/rlbench .devbin/rlbench
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
OUT="$OUT/fair" FAIR_STEPS=12 FAIR_BUDGET_S=560 FAIR_MODELS="qwen2.5-1.5b qwen2.5-3b" FAIR_RUNS="auto peer-noac-compile peer-ac-compile" \
	bash bench/fair_device.sh >"$OUT/r/fair.log" 2>&1
say "fair rc=$? at ${SECONDS}s"
grep -E 'rc=|best against best' "$OUT/r/fair.log" | cut -c1-460 | tee -a "$OUT/summary.txt"
grep -A8 '^Energy a step' "$OUT/fair/best.md" | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz r fair && rm -rf r fair)
