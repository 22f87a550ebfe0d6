#!/usr/bin/env bash
# Call 7 (one H200), build c7 (= c5's rlbench): bench/fair_device.sh's
# FAIR_BOUND path end to end on the 0.5B (rlpipe auto, the compiled peer
# without AC, the traced run, gemm_peak.py and bound.py).
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/c7/rlbench .devbin/rlbench
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
OUT="$OUT/fair" FAIR_MODELS="qwen2.5-0.5b" FAIR_RUNS="auto peer-noac-compile" FAIR_BOUND=1 FAIR_BUDGET_S=240 \
	bash bench/fair_device.sh >"$OUT/fair.log" 2>&1
say "fair rc=$? at ${SECONDS}s"
tail -n 30 "$OUT/fair.log" >>"$OUT/summary.txt"
cp "$OUT"/fair/bound-*.md "$OUT/" 2>/dev/null
(cd "$OUT" && tar czf r.tgz fair fair.log && rm -rf fair fair.log)
