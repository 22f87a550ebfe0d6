#!/usr/bin/env bash
# Call 7 (one H200): build 15 (the review's clean-up: k_adamw4 and
# k_adamw4_16 as one template, the optimizer's sums and AdamW step
# through shared helpers). gpu/cuda's AdamW, sum and norm tests and the
# stages CUDA tests.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
(cd gpu/cuda && timeout 100 ../../.devbin/15/cuda.test -test.run 'TestAdamWAndSumSquares|TestFusedNorms|TestVectorKernels|TestKernelNames' -test.v) >"$OUT/cuda-tests.log" 2>&1
say "gpu/cuda tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)' "$OUT/cuda-tests.log" | tee -a "$OUT/summary.txt"
(cd stages && timeout 150 ../.devbin/15/stages.test -test.run 'CUDA' -test.v) >"$OUT/stages-cuda.log" 2>&1
say "stages CUDA tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|FAIL|PASS)' "$OUT/stages-cuda.log" | tee -a "$OUT/summary.txt"
