#!/usr/bin/env bash
# Call 2 (one H200), build c2 (main at abc8497: the head in one kernel):
# best against best at 1.5B and 3B (bench/fair_device.sh: rlpipe auto,
# the compiled peer with and without checkpointing) with FAIR_BOUND=1
# (a traced rlpipe run per model, bench/gemm_peak.py, bench/bound.py).
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/c2/rlbench .devbin/rlbench
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
OUT="$OUT/fair" FAIR_MODELS="qwen2.5-1.5b qwen2.5-3b" FAIR_RUNS="auto peer-noac-compile peer-ac-compile" FAIR_BOUND=1 FAIR_BUDGET_S=480 \
	bash bench/fair_device.sh >"$OUT/fair.log" 2>&1
say "fair rc=$? at ${SECONDS}s"
grep -E 'best against best|rc=' "$OUT/fair.log" | tee -a "$OUT/summary.txt"
cp "$OUT"/fair/bound-*.md "$OUT/" 2>/dev/null
cat "$OUT"/bound-*.md 2>/dev/null | grep -A8 '^| bound' | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz fair fair.log && rm -rf fair fair.log)
