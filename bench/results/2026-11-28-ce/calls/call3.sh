#!/usr/bin/env bash
# Call 3 (four GPUs of one host), build r: apply_fsdp2's replicate (auto:
# the plan keeps the frozen ref whole on every rank where it fits, read in
# place, no gathers). stages' TestReplicateCUDADP2 (the replica against the
# sharded ref on two GPUs, bit for bit, and the CPU) and TestRunTinyCUDADP2;
# then best against best at dp 4 (bench/fair_device.sh, FAIR_DP=4): rlpipe
# auto (the ref replicated) and auto-shardref (--ref-replicate=false), the
# compiled peer without and with activation checkpointing, each with its
# ref sharded and replicated (--ref-replicate), 3B then 1.5B.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/t"
(cd stages && timeout 200 ../.devbin/r/stages.test -test.v -test.timeout 190s -test.run 'TestReplicateCUDADP2|TestRunTinyCUDADP2' >"$OUT/t/stages.log" 2>&1)
say "stages tests rc=$? at ${SECONDS}s"
grep -E '^(\s*--- |ok|PASS|FAIL)|panic|replicated|sharded' "$OUT/t/stages.log" | head -30 | tee -a "$OUT/summary.txt"
cp .devbin/r/rlbench .devbin/rlbench
OUT=$OUT/fair FAIR_DP=4 FAIR_BUDGET_S=480 FAIR_MODELS="qwen2.5-3b qwen2.5-1.5b" \
	FAIR_RUNS="auto auto-shardref peer-noac-compile peer-noac-compile-refrep peer-ac-compile peer-ac-compile-refrep" \
	bash bench/fair_device.sh >"$OUT/fair.log" 2>&1
say "fair rc=$? at ${SECONDS}s"
tail -n 30 "$OUT/fair.log" | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz t fair fair.log && rm -rf t fair)
