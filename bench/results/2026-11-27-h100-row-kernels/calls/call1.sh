#!/bin/bash
# Session 16, call 1: dkv-rows validation, op benchmarks, ncu on the memory-bound kernels.
# .devbin: cuda.test (7ba1334), cuda-dkv.test (the dkv-rows branch, f591980).
set -u
B=$PWD/.devbin
mkdir -p $OUT/r
cd gpu/cuda
nvidia-smi > $OUT/r/smi.txt 2>&1
echo "== dkv-rows tests" > $OUT/r/dkv.log
timeout 200 $B/cuda-dkv.test -test.run 'TestKernelsCompile|TestAttentionTensorCore|TestAttentionSpans' -test.v >> $OUT/r/dkv.log 2>&1; echo "rc=$?" >> $OUT/r/dkv.log
tail -5 $OUT/r/dkv.log
timeout 120 $B/cuda-dkv.test -test.run '^$' -test.bench 'Ops/attention_bwd_8x2048_h12/2_d128($|_dq|_dk)' -test.benchtime 20x > $OUT/r/bench-dkv.log 2>&1
timeout 120 $B/cuda.test -test.run '^$' -test.bench 'Ops/attention_bwd_8x2048_h12/2_d128($|_dq|_dk)' -test.benchtime 20x > $OUT/r/bench-attn-main.log 2>&1
timeout 200 $B/cuda.test -test.run '^$' -test.bench 'Ops/(qkv|gemm|swiglu|rmsnorm|logprobs|add_|rope|addbias)' -test.benchtime 20x > $OUT/r/bench-ops.log 2>&1
cat $OUT/r/bench-ops.log | grep -v '^goos\|^goarch\|^pkg\|^cpu'
timeout 200 ncu --clock-control none --kernel-name 'regex:k_qkv_split8|k_qkv_pack8|k_swiglu8|k_rmsnorm|k_lp_fwd' --launch-count 10 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
  $B/cuda.test -test.run '^$' -test.bench 'Ops/(qkv_split|qkv_pack|swiglu_fwd|rmsnorm_fwd_8192|logprobs_fwd)' -test.benchtime 1x > $OUT/r/ncu.txt 2>&1
echo "ncu rc=$?"; grep -c "k_" $OUT/r/ncu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
