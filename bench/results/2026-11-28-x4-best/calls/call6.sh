#!/usr/bin/env bash
# Call 6 (two H100s): build 3 (the tile queue, and TestSleepWakeCUDA's
# bound counting what earlier tests left on the GPU). gpu/cuda's tests of
# the persistent kernels and the tile queue on an H100, the stages
# package's CUDA tests (the two-GPU ones run before TestSleepWakeCUDA), then
# best against best at dp 1 on one H100, 3B and 1.5B, against the compiled
# peer, with build 1 (1b8220f) as FAIR_BASE.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/3/rlbench .devbin/rlbench
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} >"$OUT/env.txt" 2>&1
export NCCL_NVLS_ENABLE=0
(cd gpu/cuda && timeout 120 ../../.devbin/3/cuda.test -test.run 'TestGateUpSwiGLU|TestQKVRoPE|TestLogProbsFused|TestTileQueue|TestAttention|TestStreams' -test.v) >"$OUT/cuda-tests.log" 2>&1
say "gpu/cuda tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)' "$OUT/cuda-tests.log" | tee -a "$OUT/summary.txt"
(cd stages && timeout 120 ../.devbin/3/stages.test -test.run 'CUDA' -test.v) >"$OUT/stages-cuda.log" 2>&1
say "stages CUDA tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|FAIL|PASS)|asleep: NVML' "$OUT/stages-cuda.log" | tee -a "$OUT/summary.txt"
OUT=$OUT/f3 FAIR_MODELS=qwen2.5-3b FAIR_RUNS="auto peer-ac-compile" FAIR_BASE=.devbin/1/rlbench FAIR_BUDGET_S=170 bash bench/fair_device.sh >"$OUT/fair3.log" 2>&1
grep -E 'rc=|best against best|base auto|\| shared' "$OUT/fair3.log" | tee -a "$OUT/summary.txt"
say "at ${SECONDS}s"
if ((SECONDS < 330)); then
	OUT=$OUT/f15 FAIR_MODELS=qwen2.5-1.5b FAIR_RUNS="auto peer-noac-compile" FAIR_BASE=.devbin/1/rlbench FAIR_BUDGET_S=$((450 - SECONDS)) bash bench/fair_device.sh >"$OUT/fair15.log" 2>&1
	grep -E 'rc=|best against best|base auto|\| shared' "$OUT/fair15.log" | tee -a "$OUT/summary.txt"
fi
say "at ${SECONDS}s"
rm -rf "$OUT"/f3/work-* "$OUT"/f15/work-*
(cd "$OUT" && tar czf r.tgz f3 f15 fair3.log fair15.log cuda-tests.log stages-cuda.log 2>/dev/null; rm -rf f3 f15)
