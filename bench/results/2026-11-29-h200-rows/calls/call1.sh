#!/usr/bin/env bash
# Call 1 (one H200): the rows the H200 lacked in "Where rlpipe stands".
# Best against best at 0.5B (bench/fair_device.sh: rlpipe auto, the
# compiled peer with and without AC, 12 timed steps), and the offloaded
# 3B train step against the offloaded peer, eager and compiled, and
# against rlpipe resident (bench/offload_device.sh).
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/h5/rlbench .devbin/rlbench
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv,noheader >"$OUT/env.txt" 2>&1
nproc >>"$OUT/env.txt"; free -g | head -2 >>"$OUT/env.txt"
mkdir -p "$OUT/r"
OUT="$OUT/fair" FAIR_STEPS=12 FAIR_BUDGET_S=200 FAIR_MODELS="qwen2.5-0.5b" FAIR_RUNS="auto peer-noac-compile peer-ac-compile" \
	bash bench/fair_device.sh >"$OUT/r/fair.log" 2>&1
say "fair rc=$? at ${SECONDS}s"
grep -E 'rc=|best against best' "$OUT/r/fair.log" | cut -c1-460 | tee -a "$OUT/summary.txt"
grep -A8 '^Energy a step' "$OUT/fair/best.md" | tee -a "$OUT/summary.txt"
OUT="$OUT/off" OFFLOAD_BUDGET_S=330 OFFLOAD_MODELS="qwen2.5-3b" OFFLOAD_RUNS="overlap peer peer-compile resident" \
	bash bench/offload_device.sh >"$OUT/r/offload.log" 2>&1
say "offload rc=$? at ${SECONDS}s"
grep -E 'rc=' "$OUT/r/offload.log" | cut -c1-300 | tee -a "$OUT/summary.txt"
cat "$OUT/off/summary.md" | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz r fair off && rm -rf r fair off)
