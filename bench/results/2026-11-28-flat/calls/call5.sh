#!/usr/bin/env bash
# Call 5 (two GPUs of one host), build c5 (main at 176d70d's code: the
# norm backward in one wave): best against best at dp 2, 1.5B and 3B:
# rlpipe auto (its plan replicates the ref), the compiled peer without
# checkpointing (ref sharded and replicated) and with it (ref replicated).
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/c5/rlbench .devbin/rlbench
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
OUT="$OUT/fair" FAIR_DP=2 FAIR_MODELS="qwen2.5-1.5b qwen2.5-3b" FAIR_BUDGET_S=500 \
	FAIR_RUNS="auto peer-noac-compile peer-noac-compile-refrep peer-ac-compile-refrep" \
	bash bench/fair_device.sh >"$OUT/fair.log" 2>&1
say "fair rc=$? at ${SECONDS}s"
grep -E 'best against best|rc=|grad' "$OUT/fair.log" | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz fair fair.log && rm -rf fair fair.log)
