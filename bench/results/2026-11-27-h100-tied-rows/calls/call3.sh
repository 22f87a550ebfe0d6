#!/usr/bin/env bash
# Call 3: rlbench at d21c0a6 (the tied rows and the early host AdamW) with
# bench/offload_device.sh's noclip runs: the offloaded 1.5B and 3B against
# the resident ones and the PyTorch FSDP2 peer (CPUOffloadPolicy), with
# clipping (the benchmark recipe) and without.
set -u
tar xzf .devbin/b.tgz -C .devbin
OUT=$OUT OFFLOAD_MODELS="qwen2.5-1.5b qwen2.5-3b" OFFLOAD_RUNS="overlap peer resident noclip resident-noclip" OFFLOAD_BUDGET_S=560 bash bench/offload_device.sh
