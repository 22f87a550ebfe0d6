#!/bin/bash
# Session 16, call 7: best against best on 6deca79 (3B: the peer with AC; 1.5B: the peer without).
# .devbin: rlbench.gz built from 6deca79.
set -u
for f in .devbin/*.gz; do gunzip -f $f; done; chmod +x .devbin/*
R=$OUT/r; mkdir -p $R
OUT=$R/fair3b FAIR_MODELS=qwen2.5-3b FAIR_RUNS="peer-ac auto" FAIR_BUDGET_S=300 bash bench/fair_device.sh > $R/fair3b.log 2>&1
cat $R/fair3b/best.md | head -8 | tee -a $R/summary.txt
OUT=$R/fair15 FAIR_MODELS=qwen2.5-1.5b FAIR_RUNS="peer-noac auto" FAIR_BUDGET_S=220 bash bench/fair_device.sh > $R/fair15.log 2>&1
cat $R/fair15/best.md | head -8 | tee -a $R/summary.txt
cd $OUT && tar czf r.tgz r && rm -rf r
