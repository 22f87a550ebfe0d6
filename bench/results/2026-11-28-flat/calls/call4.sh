#!/usr/bin/env bash
# Call 4 (one H200), build c4 (main at the norm change, 176d70d, with
# the docs after it): gpu/cuda's whole test suite and the stages
# package's tests matching CUDA, verbose, to record which ran.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
(cd gpu/cuda && timeout 330 ../../.devbin/c4/cuda.test -test.v -test.timeout 320s >"$OUT/r/cuda.log" 2>&1)
say "gpu/cuda tests rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|PASS|FAIL)|panic' "$OUT/r/cuda.log" | grep -v -- '--- PASS' | head -40 | tee -a "$OUT/summary.txt"
say "passed: $(grep -c -- '^--- PASS' "$OUT/r/cuda.log"), skipped: $(grep -c -- '^--- SKIP' "$OUT/r/cuda.log"), failed: $(grep -c -- '^--- FAIL' "$OUT/r/cuda.log")"
(cd stages && timeout 220 ../.devbin/c4/stages.test -test.v -test.run 'CUDA' -test.timeout 210s >"$OUT/r/stages.log" 2>&1)
say "stages CUDA tests rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|PASS|FAIL)|panic' "$OUT/r/stages.log" | head -40 | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
