#!/usr/bin/env bash
# Call 6 (two GPUs of one host), build u: best against best at dp 2 with
# the ref replicated on both sides, 3B: rlpipe auto (the plan replicates
# the ref), the compiled peer without activation checkpointing (ref
# sharded and replicated) and with it (ref replicated).
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
cp .devbin/u/rlbench .devbin/rlbench
OUT=$OUT/fair FAIR_DP=2 FAIR_BUDGET_S=300 FAIR_MODELS="qwen2.5-3b" \
	FAIR_RUNS="auto peer-noac-compile peer-noac-compile-refrep peer-ac-compile-refrep" \
	bash bench/fair_device.sh >"$OUT/fair.log" 2>&1
echo "fair rc=$? at ${SECONDS}s" >>"$OUT/fair.log"
grep -v '^$' "$OUT/fair.log" | head -20
(cd "$OUT" && tar czf r.tgz fair && rm -rf fair)
