#!/usr/bin/env bash
# Call 8: best against best on build G's rlbench (late gathers + QKVRoPE):
# 3B against the peer with activation checkpointing (its best at 3B), then
# 1.5B against the peer without (its best there).
set -u
tar xzf .devbin/b.tgz -C .devbin && cp .devbin/D/rlbench .devbin/rlbench
OUT0=$OUT
run() {
	OUT=$OUT0/f-$1 FAIR_MODELS=$1 FAIR_RUNS="$2 auto" FAIR_BUDGET_S=$3 bash bench/fair_device.sh >$OUT0/fair-$1.log 2>&1
	rm -rf $OUT0/f-$1/work-*
	echo "$1: $(grep "best against best" $OUT0/fair-$1.log | tail -1)"
	grep "| shared\|| own" $OUT0/fair-$1.log | tail -1
}
run qwen2.5-3b peer-ac 300
run qwen2.5-1.5b peer-noac 150
cd $OUT0 && tar czf f.tgz f-* fair-*.log && rm -rf f-* fair-*.log
