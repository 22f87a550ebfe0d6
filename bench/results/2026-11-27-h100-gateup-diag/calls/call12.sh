#!/usr/bin/env bash
# Call 12 (as call 11, the order reversed): O is 603c0eb (the previous session's main), N is main
# (5b5f05f). The offloaded 3B train step (rlpipe overlapped) on each,
# twice, alternating which one offload_device.sh runs first: whether
# call 10's lower offloaded figure is the build's or the machine's.
set -u
OUT0=$OUT
say() { echo "$*" | tee -a "$OUT0/summary.txt"; }
tar xzf .devbin/b.tgz -C .devbin
for r in 1 2; do
	if ((r == 1)); then a=N b=O; else a=O b=N; fi
	cp .devbin/$a/rlbench .devbin/rlbench
	OUT=$OUT0/off$r OFFLOAD_MODELS=qwen2.5-3b OFFLOAD_RUNS="overlap" OFFLOAD_CANDIDATE=.devbin/$b/rlbench OFFLOAD_BUDGET_S=280 bash bench/offload_device.sh >"$OUT0/offload$r.log" 2>&1
	rm -rf "$OUT0/off$r"/work-*
	say "round $r: overlap = $a, candidate = $b"
	grep -E '^\|' "$OUT0/off$r/summary.md" 2>/dev/null | head -6 | while read -r l; do say "$l"; done
done
cd "$OUT0" && tar czf r.tgz off1 off2 offload*.log && rm -rf off1 off2 offload*.log
