#!/usr/bin/env bash
# Call 11 (one H200): best against best at 3B with the faster attention
# backward (main at 8893557): on 2 × 8192 tokens, then on 8 × 2048, the
# peer compiled with and without activation checkpointing.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/n/rlbench .devbin/rlbench
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
OUT=$OUT/l3 FAIR_MODELS=qwen2.5-3b FAIR_SEQS=2 FAIR_TOKENS=8192 FAIR_RUNS="auto peer-noac-compile peer-ac-compile" FAIR_BUDGET_S=170 bash bench/fair_device.sh >"$OUT/fairl3.log" 2>&1
grep -E 'rc=|best against best|\| shared' "$OUT/fairl3.log" | tee -a "$OUT/summary.txt"
say "at ${SECONDS}s"
OUT=$OUT/s3 FAIR_MODELS=qwen2.5-3b FAIR_RUNS="auto peer-noac-compile peer-ac-compile" FAIR_BUDGET_S=$((335 - SECONDS)) bash bench/fair_device.sh >"$OUT/fairs3.log" 2>&1
grep -E 'rc=|best against best|\| shared' "$OUT/fairs3.log" | tee -a "$OUT/summary.txt"
say "at ${SECONDS}s"
rm -rf "$OUT"/l3/work-* "$OUT"/s3/work-*
(cd "$OUT" && tar czf r.tgz l3 s3 fairl3.log fairs3.log 2>/dev/null; rm -rf l3 s3 fairl3.log fairs3.log)
