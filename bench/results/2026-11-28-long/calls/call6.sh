#!/usr/bin/env bash
# Call 6 (one H200): best against best at 1.5B on 2 sequences of 8192
# tokens (call 1 ran 3B), the peer compiled with and without activation
# checkpointing (PyTorch's default attention, cuDNN's on this GPU); then
# rlbench's timeline of that step. Build n: main at 7a1db85.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/n/rlbench .devbin/rlbench
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
OUT=$OUT/f15 FAIR_MODELS=qwen2.5-1.5b FAIR_SEQS=2 FAIR_TOKENS=8192 FAIR_RUNS="auto peer-noac-compile peer-ac-compile" FAIR_BUDGET_S=420 bash bench/fair_device.sh >"$OUT/fair15.log" 2>&1
grep -E 'rc=|best against best|\| shared' "$OUT/fair15.log" | tee -a "$OUT/summary.txt"
say "at ${SECONDS}s"
if ((SECONDS < 480)); then
	timeout $((570 - SECONDS)) .devbin/rlbench --backend cuda --config examples/models/qwen2.5-1.5b/config.json --seqs 2 --tokens-per-seq 8192 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 1 --precision bf16 --recompute-auto --cache /tmp/rbc --timeline "$OUT/15b-long.trace.json" --out "$OUT/15b-long.json" >"$OUT/15b-long.log" 2>&1
	say "timeline rc=$? at ${SECONDS}s"
fi
rm -rf "$OUT"/f15/work-*
(cd "$OUT" && tar czf r.tgz f15 fair15.log 15b-long.* 2>/dev/null; rm -rf f15 fair15.log 15b-long.*)
