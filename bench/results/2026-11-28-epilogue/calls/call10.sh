#!/usr/bin/env bash
# Call 10 (one H200): best against best at 3B and 1.5B against the
# compiled peer, rlpipe at 49fbc5f (build e: the float32 norm backward and
# the split Fill), with main at fcf9323 (build s, this work's start) as
# FAIR_BASE.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/e/rlbench .devbin/rlbench
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
OUT=$OUT/f3 FAIR_MODELS=qwen2.5-3b FAIR_RUNS="auto peer-ac-compile" FAIR_BASE=.devbin/s/rlbench FAIR_BUDGET_S=220 bash bench/fair_device.sh >"$OUT/fair3.log" 2>&1
grep -E 'rc=|best against best|base auto|\| shared' "$OUT/fair3.log" | tee -a "$OUT/summary.txt"
say "at ${SECONDS}s"
if ((SECONDS < 300)); then
	OUT=$OUT/f15 FAIR_MODELS=qwen2.5-1.5b FAIR_RUNS="auto peer-noac-compile" FAIR_BASE=.devbin/s/rlbench FAIR_BUDGET_S=$((500 - SECONDS)) bash bench/fair_device.sh >"$OUT/fair15.log" 2>&1
	grep -E 'rc=|best against best|base auto|\| shared' "$OUT/fair15.log" | tee -a "$OUT/summary.txt"
fi
say "at ${SECONDS}s"
rm -rf "$OUT"/f3/work-* "$OUT"/f15/work-*
(cd "$OUT" && tar czf r.tgz f3 f15 fair3.log fair15.log 2>/dev/null; rm -rf f3 f15 fair3.log fair15.log)
