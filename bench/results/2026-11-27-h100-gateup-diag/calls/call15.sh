#!/usr/bin/env bash
# Call 15: Z is main at c223268 (the session's final GPU code: the ref
# read in place, stmatrix staging, wg_consume). TestRunTinyCUDA and
# TestInPlace*; then best against best at 3B twice (the peer with
# activation checkpointing, rlpipe auto), each a fresh fair_device.sh.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd stages && timeout 150 ../.devbin/Z/stages.test -test.run 'TestRunTinyCUDA$|TestInPlace' >"$R/stages.log" 2>&1)
say "Z stage tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/stages.log" | tr '\n' ' ')"
cp .devbin/Z/rlbench .devbin/rlbench
for i in 1 2; do
	OUT=$OUT/f$i FAIR_MODELS=qwen2.5-3b FAIR_RUNS="peer-ac auto" FAIR_BUDGET_S=280 bash bench/fair_device.sh >"$R/fair$i.log" 2>&1
	rm -rf "$OUT/f$i"/work-*
	say "fair $i: $(grep 'best against best' "$R/fair$i.log" | tail -1)"
	say "fair $i: $(grep '| shared' "$R/fair$i.log" | tail -1)"
done
(cd "$OUT" && tar czf r.tgz r f1 f2 && rm -rf r f1 f2)
