#!/usr/bin/env bash
# Call 8: best against best at 1.5B and 0.5B with the 96-column kernel
# (527df08): the peer without activation checkpointing (its best at these
# sizes) against rlpipe's auto run.
set -u
OUT0=$OUT
for m in qwen2.5-1.5b qwen2.5-0.5b; do
	OUT=$OUT0/f-$m FAIR_MODELS=$m FAIR_RUNS="peer-noac auto" FAIR_BUDGET_S=150 bash bench/fair_device.sh >$OUT0/fair-$m.log 2>&1
	rm -rf $OUT0/f-$m/work-*
	grep "best against best" $OUT0/fair-$m.log | tail -1
	grep "| shared\|| own" $OUT0/fair-$m.log | tail -1
done
cd $OUT0 && tar czf f.tgz f-* fair-*.log && rm -rf f-* fair-*.log
