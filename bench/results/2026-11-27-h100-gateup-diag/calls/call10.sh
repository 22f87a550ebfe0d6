#!/usr/bin/env bash
# Call 10: N is main (5b5f05f: the ref read in place, stmatrix staging). Best against best at 1.5B and 0.5B (the
# peer without activation checkpointing, its best there), then the
# offloaded 3B (rlpipe overlapped, the peer under CPUOffloadPolicy, rlpipe
# resident).
set -u
OUT0=$OUT
say() { echo "$*" | tee -a "$OUT0/summary.txt"; }
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/N/rlbench .devbin/rlbench
for m in qwen2.5-1.5b qwen2.5-0.5b; do
	OUT=$OUT0/f-$m FAIR_MODELS=$m FAIR_RUNS="peer-noac auto" FAIR_BUDGET_S=150 bash bench/fair_device.sh >"$OUT0/fair-$m.log" 2>&1
	rm -rf "$OUT0/f-$m"/work-*
	say "$m: $(grep 'best against best' "$OUT0/fair-$m.log" | tail -1)"
	say "$m: $(grep '| shared\|| own' "$OUT0/fair-$m.log" | tail -1)"
done
OUT=$OUT0/off OFFLOAD_MODELS=qwen2.5-3b OFFLOAD_RUNS="overlap peer resident" OFFLOAD_BUDGET_S=280 bash bench/offload_device.sh >"$OUT0/offload.log" 2>&1
say "offload rc=$?"
grep -E '^\|' "$OUT0/off/summary.md" 2>/dev/null | head -12 | while read -r l; do say "$l"; done
cd "$OUT0" && tar czf r.tgz f-* fair-*.log off offload.log && rm -rf f-* fair-*.log off offload.log
