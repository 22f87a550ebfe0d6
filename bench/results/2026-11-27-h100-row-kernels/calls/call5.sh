#!/bin/bash
# Session 16, call 5: QKVSplit/QKVPack with compile-time 16-bit dtypes (k_qkv_split8_bf16, ...): tests, ops, 3B A/B against call 3's build.
# .devbin: rlbench.gz, cuda.test.gz (6deca79's tree); rlbench-c3.gz, cuda-c3.test.gz (call 3's build).
set -u
for f in .devbin/*.gz; do gunzip -f $f; done; chmod +x .devbin/*
B=$PWD/.devbin
R=$OUT/r; mkdir -p $R
( cd gpu/cuda && timeout 200 $B/cuda.test -test.run 'TestKernelsCompile|TestQKVFused|TestRoPE|TestElementwise|TestRMSNorm|TestFusedNorms|TestVec8|TestKernelNames' -test.v > $R/cuda-tests.log 2>&1; echo "cuda tests rc=$?"; grep -E "^(--- |FAIL|ok|PASS)" $R/cuda-tests.log ) | tee -a $R/summary.txt
( cd gpu/cuda; for i in 1 2; do for b in cuda-c3.test cuda.test; do timeout 60 $B/$b -test.run '^$' -test.bench 'Ops/qkv' -test.benchtime 20x > $R/ops-$b-$i.log 2>&1; done; done )
paste <(grep Benchmark $R/ops-cuda-c3.test-2.log | awk '{print $1, $3, $5, $6}') <(grep Benchmark $R/ops-cuda.test-2.log | awk '{print $3, $5, $6}') | tee -a $R/summary.txt
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for b in rlbench rlbench-c3 rlbench rlbench-c3; do
  i=$((i+1))
  timeout 200 $B/$b "${W[@]}" --out $R/3b-$b-$i.json > $R/3b-$b-$i.log 2>&1
  echo "3b $b $i rc=$? $(tail -1 $R/3b-$b-$i.log)" | tee -a $R/summary.txt
done
timeout 100 $B/rlbench "${W[@]}" --steps 2 --timeline $R/3b.trace.json --out $R/3b-timeline.json > $R/3b-timeline.log 2>&1
echo "timeline rc=$? $(tail -1 $R/3b-timeline.log)" | tee -a $R/summary.txt
cd $OUT && tar czf r.tgz r && rm -rf r
