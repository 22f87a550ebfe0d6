#!/usr/bin/env bash
# Call 10: best against best on a85f64a (late gathers, QKVRoPE, the
# attention forward's three K/V buffers, the head's 256-column tiles): 3B
# against the peer with activation checkpointing (its best at 3B), 1.5B
# and 0.5B against the peer without, then 3B again.
set -u
OUT0=$OUT
run() {
	OUT=$OUT0/f-$1-$4 FAIR_MODELS=$1 FAIR_RUNS="$2 auto" FAIR_BUDGET_S=$3 bash bench/fair_device.sh >$OUT0/fair-$1-$4.log 2>&1
	rm -rf $OUT0/f-$1-$4/work-*
	echo "$1 ($4): $(grep "best against best" $OUT0/fair-$1-$4.log | tail -1)"
	grep "| shared\|| own" $OUT0/fair-$1-$4.log | tail -1
}
run qwen2.5-3b peer-ac 300 1
run qwen2.5-1.5b peer-noac 150 1
run qwen2.5-0.5b peer-noac 150 1
run qwen2.5-3b peer-ac 300 2
cd $OUT0 && tar czf f.tgz f-* fair-*.log && rm -rf f-* fair-*.log
