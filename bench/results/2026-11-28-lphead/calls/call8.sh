#!/usr/bin/env bash
# Call 8 (one H200), build s8 (main at the review commit: lpStoreLayout): the
# log-prob tests after the review's refactor of lpHeadStore's layout.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/env.txt" 2>&1
(cd gpu/cuda && timeout 120 ../../.devbin/s8/cuda.test -test.v -test.run 'TestLogProbs|TestLogitsBackward' >"$OUT/cuda.log" 2>&1)
say "rc=$?"
grep -E '^(--- |ok|PASS|FAIL)|panic' "$OUT/cuda.log" | tee -a "$OUT/summary.txt"
