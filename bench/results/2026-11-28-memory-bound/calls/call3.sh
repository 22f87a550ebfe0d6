#!/usr/bin/env bash
# Call 3 (one H200): build 13 (build 12 with the norm backward's rows
# loaded ahead only in the fused add's one-group kernel, k_rmsnorm_bwd8_1a;
# the plain backward back to loading a row as it reaches it). gpu/cuda's
# norm, AdamW and sum tests, the stages CUDA tests, the op benchmarks
# once; then best against best at 3B and 1.5B against the compiled peer,
# with build 10 (main at b2f927c, this session's start) as FAIR_BASE.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/13/rlbench .devbin/rlbench
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
(cd gpu/cuda && timeout 120 ../../.devbin/13/cuda.test -test.run 'TestFusedNorms|TestAdamWAndSumSquares|TestRMSNorm|TestVectorKernels|TestKernelNames' -test.v) >"$OUT/cuda-tests.log" 2>&1
say "gpu/cuda tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)' "$OUT/cuda-tests.log" | tee -a "$OUT/summary.txt"
(cd stages && timeout 150 ../.devbin/13/stages.test -test.run 'CUDA' -test.v) >"$OUT/stages-cuda.log" 2>&1
say "stages CUDA tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|FAIL|PASS)' "$OUT/stages-cuda.log" | tee -a "$OUT/summary.txt"
(cd gpu/cuda && timeout 60 ../../.devbin/13/cuda.test -test.run '^$' -test.bench 'Ops/(rmsnorm_bwd|adamw|sumsquares)' -test.benchtime 50x) >"$OUT/ops-b13.txt" 2>&1
say "ops build 13: rc=$? at ${SECONDS}s"
grep -E '^Benchmark' "$OUT/ops-b13.txt" | tee -a "$OUT/summary.txt"
OUT=$OUT/f3 FAIR_MODELS=qwen2.5-3b FAIR_RUNS="auto peer-ac-compile" FAIR_BASE=.devbin/10/rlbench FAIR_BUDGET_S=200 bash bench/fair_device.sh >"$OUT/fair3.log" 2>&1
grep -E 'rc=|best against best|base auto|\| shared' "$OUT/fair3.log" | tee -a "$OUT/summary.txt"
say "at ${SECONDS}s"
if ((SECONDS < 300)); then
	OUT=$OUT/f15 FAIR_MODELS=qwen2.5-1.5b FAIR_RUNS="auto peer-noac-compile" FAIR_BASE=.devbin/10/rlbench FAIR_BUDGET_S=$((540 - SECONDS)) bash bench/fair_device.sh >"$OUT/fair15.log" 2>&1
	grep -E 'rc=|best against best|base auto|\| shared' "$OUT/fair15.log" | tee -a "$OUT/summary.txt"
fi
say "at ${SECONDS}s"
rm -rf "$OUT"/f3/work-* "$OUT"/f15/work-*
(cd "$OUT" && tar czf r.tgz f3 f15 fair3.log fair15.log cuda-tests.log stages-cuda.log ops-b13.txt 2>/dev/null; rm -rf f3 f15 fair3.log fair15.log stages-cuda.log)
