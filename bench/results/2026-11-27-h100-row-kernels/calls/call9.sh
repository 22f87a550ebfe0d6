#!/bin/bash
# Session 16, call 9: the review's qkvLaunch change (its width from vec, not from the kernel's name): TestQKVFused, TestQKVKernel, TestRunTinyCUDA.
set -u
for f in .devbin/*.gz; do gunzip -f $f; done; chmod +x .devbin/*
B=$PWD/.devbin
R=$OUT/r; mkdir -p $R
( cd gpu/cuda && timeout 240 $B/cuda.test -test.run 'TestQKVFused|TestQKVKernel|TestRoPE' -test.v > $R/cuda-tests.log 2>&1; echo "cuda tests rc=$?"; grep -E "^(--- |FAIL|ok|PASS)" $R/cuda-tests.log )
( cd stages && timeout 120 $B/stages.test -test.run 'TestRunTinyCUDA$' -test.v > $R/stages-tests.log 2>&1; echo "stages rc=$?"; grep -E "^(--- |FAIL|ok|PASS)" $R/stages-tests.log )
cd $OUT && tar czf r.tgz r && rm -rf r
