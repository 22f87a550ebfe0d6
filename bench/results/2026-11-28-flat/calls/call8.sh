#!/usr/bin/env bash
# Call 8 (one H200), build c8 (the review: resident refuses a kernel the
# driver says cannot run a block size): gpu/cuda's TestResidentBlocks and
# the norm tests.
set -u
tar xzf .devbin/b.tgz -C .devbin
(cd gpu/cuda && timeout 150 ../../.devbin/c8/cuda.test -test.v -test.run 'TestResidentBlocks|TestFusedNorms|TestRMSNorm' >"$OUT/cuda.log" 2>&1)
echo "rc=$?" >>"$OUT/cuda.log"
grep -E '^(--- |ok|PASS|FAIL|rc=)|blocks an SM' "$OUT/cuda.log"
