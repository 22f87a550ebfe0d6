#!/bin/bash
# Session 16, call 3: best against best (3B: peer with AC, its no-AC run ran out of memory in earlier calls; 1.5B: peer without AC), a 3B timeline.
# .devbin: rlbench.gz, cuda.test.gz built from 98cd7b7 + call3-build.patch.
set -u
for f in .devbin/*.gz; do gunzip -f $f; done; chmod +x .devbin/*
R=$OUT/r; mkdir -p $R
( cd gpu/cuda && timeout 150 ../../.devbin/cuda.test -test.run 'TestKernelsCompile|TestElementwise|TestRMSNorm|TestFusedNorms|TestRoPE|TestQKVFused|TestVec8' > $R/cuda-tests.log 2>&1; echo "cuda tests rc=$?"; grep -E "^(--- FAIL|FAIL|ok|PASS)" $R/cuda-tests.log ) | tee -a $R/summary.txt
OUT=$R/fair3b FAIR_MODELS=qwen2.5-3b FAIR_RUNS="peer-ac auto" FAIR_BUDGET_S=300 bash bench/fair_device.sh > $R/fair3b.log 2>&1
cat $R/fair3b/best.md | tee -a $R/summary.txt
timeout 100 .devbin/rlbench --backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --timeline $R/3b.trace.json --out $R/3b-timeline.json > $R/3b-timeline.log 2>&1
echo "timeline rc=$? $(tail -1 $R/3b-timeline.log)" | tee -a $R/summary.txt
OUT=$R/fair15 FAIR_MODELS=qwen2.5-1.5b FAIR_RUNS="peer-noac auto" FAIR_BUDGET_S=200 bash bench/fair_device.sh > $R/fair15.log 2>&1
cat $R/fair15/best.md | tee -a $R/summary.txt
cd $OUT && tar czf r.tgz r && rm -rf r
