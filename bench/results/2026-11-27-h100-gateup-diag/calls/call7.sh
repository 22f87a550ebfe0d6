#!/usr/bin/env bash
# Call 7: P is branch in-place (94e0fa1: main's e487ebc, the stmatrix
# staging, + the ref read in place on one rank). Best against best at 3B
# three times (the peer with activation checkpointing, rlpipe auto), each
# a fresh fair_device.sh.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
cp .devbin/P/rlbench .devbin/rlbench
for i in 1 2 3; do
	OUT=$OUT/f$i FAIR_MODELS=qwen2.5-3b FAIR_RUNS="peer-ac auto" FAIR_BUDGET_S=280 bash bench/fair_device.sh >"$R/fair$i.log" 2>&1
	rm -rf "$OUT/f$i"/work-*
	say "fair $i: $(grep 'best against best' "$R/fair$i.log" | tail -1)"
	say "fair $i: $(grep '| shared' "$R/fair$i.log" | tail -1)"
done
(cd "$OUT" && tar czf r.tgz r f1 f2 f3 && rm -rf r f1 f2 f3)
