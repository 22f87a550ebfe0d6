#!/usr/bin/env bash
# Call 1 (H100): device grads only through an update (9ebdc41) on a GPU.
# The stages package's CUDA tests (the train path, one GPU), then
# best against best at 3B and 1.5B with the "before" build (ffcc837) as
# FAIR_BASE in the same call, then the 3B step's timeline after.
# Build 1 is main at 1b8220f, build 0 is ffcc837 (rlbench only).
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/1/rlbench .devbin/rlbench
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
	nproc
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
(cd stages && timeout 150 ../.devbin/1/stages.test -test.run 'CUDA' -test.v) >"$OUT/stages-cuda.log" 2>&1
say "stages CUDA tests: rc=$? at ${SECONDS}s; $(grep -cE '^(=== RUN|--- PASS|--- FAIL|--- SKIP)' "$OUT/stages-cuda.log") lines"
grep -E '^(--- |ok|FAIL|PASS)' "$OUT/stages-cuda.log" | tee -a "$OUT/summary.txt"
OUT=$OUT/f3 FAIR_MODELS=qwen2.5-3b FAIR_RUNS="auto peer-ac-compile" FAIR_BASE=.devbin/0/rlbench FAIR_BUDGET_S=200 bash bench/fair_device.sh >"$OUT/fair3.log" 2>&1
grep -E 'rc=|best against best|base auto|\| shared' "$OUT/fair3.log" | tee -a "$OUT/summary.txt"
say "at ${SECONDS}s"
OUT=$OUT/f15 FAIR_MODELS=qwen2.5-1.5b FAIR_RUNS="auto peer-noac-compile" FAIR_BASE=.devbin/0/rlbench FAIR_BUDGET_S=170 bash bench/fair_device.sh >"$OUT/fair15.log" 2>&1
grep -E 'rc=|best against best|base auto|\| shared' "$OUT/fair15.log" | tee -a "$OUT/summary.txt"
say "at ${SECONDS}s"
rm -rf "$OUT"/f3/work-* "$OUT"/f15/work-*
if ((SECONDS < 470)); then
	M=qwen2.5-3b
	timeout $((580 - SECONDS)) .devbin/rlbench --backend cuda --config examples/models/$M/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 2 --timeline "$OUT/3b.trace.json" --out "$OUT/tl-3b.json" >"$OUT/tl.log" 2>&1
	say "timeline: rc=$? $(tail -1 "$OUT/tl.log") at ${SECONDS}s"
fi
(cd "$OUT" && tar czf r.tgz f3 f15 fair3.log fair15.log stages-cuda.log tl.log tl-3b.json 3b.trace.json 2>/dev/null; rm -rf f3 f15)
