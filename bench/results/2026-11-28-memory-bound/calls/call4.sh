#!/usr/bin/env bash
# Call 4 (two H200s): build 13's stages CUDA tests, the two-GPU ones
# included (dp 2 and cp 2 keep the fp32 copy of the grads; AdamW and the
# sums run the new kernels there), and gpu/cuda's AdamW, sum and norm
# tests on the second GPU.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
export NCCL_NVLS_ENABLE=0
(cd stages && timeout 200 ../.devbin/13/stages.test -test.run 'CUDA' -test.v) >"$OUT/stages-cuda.log" 2>&1
say "stages CUDA tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|FAIL|PASS)' "$OUT/stages-cuda.log" | tee -a "$OUT/summary.txt"
(cd gpu/cuda && CUDA_VISIBLE_DEVICES=1 timeout 100 ../../.devbin/13/cuda.test -test.run 'TestFusedNorms|TestAdamWAndSumSquares|TestVectorKernels' -test.v) >"$OUT/cuda-tests.log" 2>&1
say "gpu/cuda tests (GPU 1): rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)' "$OUT/cuda-tests.log" | tee -a "$OUT/summary.txt"
