#!/usr/bin/env bash
# Call 6 (one H200): best against best again, with both of the compiled
# peer's configurations at 3B (call 5, like the H200 calls before it,
# ran the 3B peer with activation checkpointing only, which on an H200 is
# not its fastest: the four-H200 call of 2026-11-28-x4-best had it at
# 23,413 tok/s without AC at dp 1), then at 1.5B. rlpipe is call 5's new
# (the commit 64c86da), FAIR_BASE main at ff8996d.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/new/rlbench .devbin/rlbench
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
{
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
	python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} >"$OUT/env.txt" 2>&1
OUT=$OUT/f3 FAIR_MODELS=qwen2.5-3b FAIR_RUNS="auto peer-noac-compile peer-ac-compile" FAIR_BASE=.devbin/s/rlbench FAIR_BUDGET_S=300 bash bench/fair_device.sh >"$OUT/fair3.log" 2>&1
grep -E 'rc=|best against best|base auto|\| shared' "$OUT/fair3.log" | tee -a "$OUT/summary.txt"
say "at ${SECONDS}s"
if ((SECONDS < 380)); then
	OUT=$OUT/f15 FAIR_MODELS=qwen2.5-1.5b FAIR_RUNS="auto peer-noac-compile peer-ac-compile" FAIR_BASE=.devbin/s/rlbench FAIR_BUDGET_S=$((560 - SECONDS)) bash bench/fair_device.sh >"$OUT/fair15.log" 2>&1
	grep -E 'rc=|best against best|base auto|\| shared' "$OUT/fair15.log" | tee -a "$OUT/summary.txt"
fi
say "at ${SECONDS}s"
rm -rf "$OUT"/f3/work-* "$OUT"/f15/work-*
(cd "$OUT" && tar czf r.tgz f3 f15 fair3.log fair15.log 2>/dev/null; rm -rf f3 f15 fair3.log fair15.log)
