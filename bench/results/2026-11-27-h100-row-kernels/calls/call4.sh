#!/bin/bash
# Session 16, call 4: ncu --set full on the instruction-bound row kernels (qkv split/pack, rmsnorm backward) and the attention forward.
# .devbin: cuda.test.gz as in call 3. (--launch-count 4 stopped after the qkv kernels: only they were profiled.)
set -u
for f in .devbin/*.gz; do gunzip -f $f; done; chmod +x .devbin/*
R=$OUT/r; mkdir -p $R
cd gpu/cuda
timeout 250 ncu --clock-control none --set full --import-source no --kernel-name 'regex:k_qkv_split8|k_qkv_pack8|k_rmsnorm_bwd8_1|k_ws_fwd_bf16_128' --launch-count 4 \
  ../../.devbin/cuda.test -test.run '^$' -test.bench 'Ops/(qkv_split|qkv_pack|rmsnorm_bwd_8192x1536_bf16_\+dw|attention_fwd_8x2048_h12/2_d128$)' -test.benchtime 1x > $R/ncu-full.txt 2>&1
echo "ncu rc=$?"
grep -E "^  k_|Duration|Compute \(SM\) Throughput|DRAM Throughput" $R/ncu-full.txt
cd $OUT && tar czf r.tgz r && rm -rf r
