#!/bin/bash
# Session 16, call 8: the offloaded 3B (rlpipe offloaded and resident, the peer under CPUOffloadPolicy) and 0.5B best against best, on 0d5b305.
# .devbin: rlbench.gz built from 0d5b305.
set -u
for f in .devbin/*.gz; do gunzip -f $f; done; chmod +x .devbin/*
R=$OUT/r; mkdir -p $R
OUT=$R/off3b OFFLOAD_MODELS=qwen2.5-3b OFFLOAD_RUNS="overlap peer resident" OFFLOAD_BUDGET_S=380 bash bench/offload_device.sh > $R/off3b.log 2>&1
tail -30 $R/off3b.log | tee -a $R/summary.txt
OUT=$R/fair05 FAIR_MODELS=qwen2.5-0.5b FAIR_RUNS="peer-noac peer-ac auto" FAIR_BUDGET_S=170 bash bench/fair_device.sh > $R/fair05.log 2>&1
head -8 $R/fair05/best.md | tee -a $R/summary.txt
cd $OUT && tar czf r.tgz r && rm -rf r
