#!/usr/bin/env bash
# Call 7: best against best at the session's end (rlbench at b92cec3,
# this session's last code): the resident step's code is as
# before this session, re-measured for the targets table.
set -u
tar xzf .devbin/b.tgz -C .devbin
OUT=$OUT FAIR_MODELS="qwen2.5-1.5b qwen2.5-3b" FAIR_RUNS="peer-noac peer-ac auto" FAIR_BUDGET_S=560 bash bench/fair_device.sh
