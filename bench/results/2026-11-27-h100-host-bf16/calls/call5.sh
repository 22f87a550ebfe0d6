#!/usr/bin/env bash
# Call 5: rlbench at 53b29b5 (the offloaded step's code as in call 4) on
# another machine: the offloaded 1.5B and 3B (overlapped, the default)
# against the resident ones.
set -u
tar xzf .devbin/b.tgz -C .devbin
OUT=$OUT OFFLOAD_MODELS="qwen2.5-1.5b qwen2.5-3b" OFFLOAD_RUNS="overlap resident" OFFLOAD_BUDGET_S=300 bash bench/offload_device.sh
