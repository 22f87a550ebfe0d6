#!/usr/bin/env bash
# Call 9: the landed build's GPU tests (run from the repository root).
B=$PWD/.devbin
(cd gpu/cuda && timeout 150 $B/cuda.test -test.run 'TestKernelsCompile|TestGateUpSwiGLU|TestElementwise' -test.v > $OUT/tests.log 2>&1; echo "cuda rc=$?")
(cd stages && timeout 90 $B/stages.test -test.run 'TestRunTinyCUDA$|TestGateUpFused' -test.v > $OUT/stages.log 2>&1; echo "stages rc=$?")
grep -E '^(--- |FAIL|PASS|ok)' $OUT/tests.log $OUT/stages.log
