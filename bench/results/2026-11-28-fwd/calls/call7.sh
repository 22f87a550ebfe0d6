#!/usr/bin/env bash
# Call 7 (two GPUs of one host): best against best at dp 2 and at dp 1 on
# the same machine, 1.5B and 3B, rlpipe's auto against the peer under
# torch.compile (no AC, and with AC for 3B), for the per-GPU scaling
# efficiency of each side's best configuration (issue 13) and the ratio at
# dp 2 (issue 11). Build 1 is main at 9eb46cc (overlap_reduce auto: the plan turns it on at dp 2).
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/1/rlbench .devbin/rlbench
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	nvidia-smi topo -m
	python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
	nproc
} >"$OUT/env.txt" 2>&1
head -5 "$OUT/env.txt"
for dp in 2 1; do
	for m in qwen2.5-1.5b qwen2.5-3b; do
		runs="auto peer-noac-compile"
		[[ $m == qwen2.5-3b ]] && runs="$runs peer-ac-compile"
		left=$((575 - SECONDS))
		((left > 60)) || { say "dp $dp $m: skipped, ${left}s left"; continue; }
		b=130
		[[ $m == qwen2.5-3b ]] && b=170
		OUT=$OUT/dp$dp-$m FAIR_DP=$dp FAIR_MODELS=$m FAIR_RUNS="$runs" FAIR_BUDGET_S=$((b < left ? b : left)) bash bench/fair_device.sh >"$OUT/fair-dp$dp-$m.log" 2>&1
		grep -E 'rc=|best against best|\| shared' "$OUT/fair-dp$dp-$m.log" | sed "s/^/dp $dp: /" | tee -a "$OUT/summary.txt"
		rm -rf "$OUT"/dp$dp-$m/work-*
		say "at ${SECONDS}s"
	done
done
(cd "$OUT" && tar czf r.tgz dp* fair-*.log && rm -rf dp* fair-*.log)
