#!/usr/bin/env bash
# Call 4: N is the working tree: the host AdamW in 1 MiB tasks handed out
# to its workers, and apply_fsdp2's host_bf16_copy as an option
# (rlbench --host-bf16-copy). The CUDA stage tests; then the offload
# benchmark of the 3B: rlpipe overlapped (the default), with the bf16
# copy, the PyTorch FSDP2 peer under CPUOffloadPolicy, and rlpipe
# resident; then overlapped and bf16 copy once more.
set -u
tar xzf .devbin/b.tgz -C .devbin
mv .devbin/N/rlbench .devbin/rlbench
mkdir -p "$OUT/t"
(cd stages && timeout 200 ../.devbin/N/stages.test -test.run 'TestHostBF16|TestRunTinyCUDA$|TestHostUpdateOverlap' -test.v >"$OUT/t/stages.log" 2>&1)
echo "stage tests rc=$? $(grep -E '^(--- FAIL|--- PASS|--- SKIP|FAIL|PASS|ok)' "$OUT/t/stages.log" | tr '\n' ' ')" | tee "$OUT/tests.txt"
rm -rf "$OUT/t"
OUT=$OUT/a OFFLOAD_MODELS=qwen2.5-3b OFFLOAD_RUNS="overlap bf16copy peer resident" OFFLOAD_BUDGET_S=420 bash bench/offload_device.sh
OUT=$OUT/b OFFLOAD_MODELS=qwen2.5-3b OFFLOAD_RUNS="overlap bf16copy" OFFLOAD_BUDGET_S=120 bash bench/offload_device.sh
