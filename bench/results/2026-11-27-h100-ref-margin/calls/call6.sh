#!/usr/bin/env bash
# Call 6: C is main with TestKernelsCompile logging each module's compile
# time: every module compiled for sm_90a, one at a time.
set -u
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && RLPIPE_COMPILE_ARCHS=sm_90a timeout 400 ../../.devbin/C/cuda.test -test.run 'TestKernelsCompile$' -test.v >"$OUT/compile.log" 2>&1)
say "rc=$?"
grep -E 'for sm_90a|^(--- |ok|PASS|FAIL)' "$OUT/compile.log" | while read -r l; do say "$l"; done
