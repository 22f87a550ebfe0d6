#!/bin/bash
# Session 16, call 10: the peer on rlpipe's weights and rollouts (peer_fsdp2.py --weights, --rollouts via fair_device.sh): 0.5B and 1.5B grad norms of the same inputs.
set -u
for f in .devbin/*.gz; do gunzip -f $f; done; chmod +x .devbin/*
R=$OUT/r; mkdir -p $R
OUT=$R/fair05 FAIR_MODELS=qwen2.5-0.5b FAIR_RUNS="auto peer-noac" FAIR_BUDGET_S=120 bash bench/fair_device.sh > $R/fair05.log 2>&1
grep -A3 "inputs |" $R/fair05/best.md | tee -a $R/summary.txt
OUT=$R/fair15 FAIR_MODELS=qwen2.5-1.5b FAIR_RUNS="auto peer-noac" FAIR_BUDGET_S=170 bash bench/fair_device.sh > $R/fair15.log 2>&1
grep -A3 "inputs |" $R/fair15/best.md | tee -a $R/summary.txt
grep -h "best against best" $R/fair*/best.md | tee -a $R/summary.txt
rm -rf $R/fair*/work-*
cd $OUT && tar czf r.tgz r && rm -rf r
