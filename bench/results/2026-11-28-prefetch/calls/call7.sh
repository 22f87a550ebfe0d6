#!/usr/bin/env bash
# Call 7 (2 × H200): the stages package's CUDA tests at main 0625933 (the
# code of calls 5 and 6), for the ones that need two GPUs
# (TestRunTinyCUDADP2, TestRunTinyCUDACP2, TestEarlyUpdateCUDADP2), which
# the one-GPU calls skip.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
(cd stages && timeout 400 ../.devbin/new/stages.test -test.run 'CUDA' -test.v) >"$OUT/stages-cuda.log" 2>&1
say "stages CUDA tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|FAIL|PASS)' "$OUT/stages-cuda.log" | tee -a "$OUT/summary.txt"
gzip "$OUT/stages-cuda.log"
