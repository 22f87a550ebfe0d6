#!/usr/bin/env bash
# Call 8 (two GPUs): stages' CUDA tests of the early host AdamW at c0db255
# + the dp 2 test: on one GPU with and without the tied rows, and at dp 2
# over NCCL (the embedding's grads through the host's adds, which the
# early AdamW waits for); the tiny recipe's CUDA runs on one and two GPUs.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
nvidia-smi -L >"$OUT/env.txt"
(cd stages && timeout 400 ../.devbin/N/stages.test -test.run 'TestEarlyUpdateCUDA|TestEarlyUpdateCUDADP2|TestTiedRowsCUDA|TestRunTinyCUDA$|TestRunTinyCUDADP2' -test.v >"$OUT/stages-tests.txt" 2>&1)
echo "stages tests rc=$? $(grep -E '^(--- |ok|FAIL)' "$OUT/stages-tests.txt" | tr '\n' ' ')" | tee "$OUT/summary.txt"
