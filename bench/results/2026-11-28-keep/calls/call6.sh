#!/usr/bin/env bash
# Call 6 (H100): build 9 (main at f1f6045: the persistent products' shared
# producer loop and setup, after calls 1-5). gpu/cuda's tests of the four
# persistent products and the tile queue; model's HF parity on CUDA; the
# stages CUDA tests; then best against best at 3B and 1.5B against the
# compiled peer, with build 0 (main at f4695d1, before the dswiglu kernel
# and the plan without dact) as FAIR_BASE.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/9/rlbench .devbin/rlbench
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
(cd gpu/cuda && timeout 120 ../../.devbin/9/cuda.test -test.run 'TestDownSwiGLUBackward|TestGateUpSwiGLU|TestQKVRoPE|TestLogProbsFused|TestTileQueue' -test.v) >"$OUT/cuda-tests.log" 2>&1
say "gpu/cuda tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)' "$OUT/cuda-tests.log" | tee -a "$OUT/summary.txt"
(cd model && timeout 90 ../.devbin/9/model.test -test.run 'ParityHF|BF16|DownSwiGLU|GateUp' -test.v) >"$OUT/model-tests.log" 2>&1
say "model tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)' "$OUT/model-tests.log" | tee -a "$OUT/summary.txt"
(cd stages && timeout 120 ../.devbin/9/stages.test -test.run 'CUDA' -test.v) >"$OUT/stages-cuda.log" 2>&1
say "stages CUDA tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|FAIL|PASS)' "$OUT/stages-cuda.log" | tee -a "$OUT/summary.txt"
OUT=$OUT/f3 FAIR_MODELS=qwen2.5-3b FAIR_RUNS="auto peer-ac-compile" FAIR_BASE=.devbin/0/rlbench FAIR_BUDGET_S=150 bash bench/fair_device.sh >"$OUT/fair3.log" 2>&1
grep -E 'rc=|best against best|base auto|\| shared' "$OUT/fair3.log" | tee -a "$OUT/summary.txt"
say "at ${SECONDS}s"
if ((SECONDS < 230)); then
	OUT=$OUT/f15 FAIR_MODELS=qwen2.5-1.5b FAIR_RUNS="auto peer-noac-compile" FAIR_BASE=.devbin/0/rlbench FAIR_BUDGET_S=$((330 - SECONDS)) bash bench/fair_device.sh >"$OUT/fair15.log" 2>&1
	grep -E 'rc=|best against best|base auto|\| shared' "$OUT/fair15.log" | tee -a "$OUT/summary.txt"
fi
say "at ${SECONDS}s"
rm -rf "$OUT"/f3/work-* "$OUT"/f15/work-*
(cd "$OUT" && tar czf r.tgz f3 f15 fair3.log fair15.log cuda-tests.log model-tests.log stages-cuda.log 2>/dev/null; rm -rf f3 f15 fair3.log fair15.log model-tests.log)
