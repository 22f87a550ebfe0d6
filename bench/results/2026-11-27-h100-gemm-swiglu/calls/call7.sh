#!/bin/bash
# Session 17, call 7: the final gemm-swiglu build (0d13353): the kernel's tests, then 3B best against best.
set -u
(cd gpu/cuda && timeout 90 ../../.devbin/cuda.test -test.run 'TestGateUpSwiGLU|TestKernelsCompile' -test.v > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/tests.log)
tail -3 $OUT/tests.log
OUT=$OUT/f FAIR_MODELS=qwen2.5-3b FAIR_RUNS="peer-ac auto" FAIR_BUDGET_S=250 bash bench/fair_device.sh > $OUT/fair.log 2>&1
rm -rf $OUT/f/work-*
cat $OUT/f/best.md
