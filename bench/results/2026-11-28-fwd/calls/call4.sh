#!/usr/bin/env bash
# Call 4 (four GPUs of one host): where rlpipe's 3B train step loses per
# GPU at dp 4 (call 3: 88.9% of dp 1's speed, against 92.4% in
# 2026-11-28-x4-best's call 2 with an older build), and apply_fsdp2's
# overlap_reduce against it. Build 1 (main at e032d70), the benchmark's
# step at recompute auto, 8 x 2048 tokens a GPU: dp 1 with a timeline;
# dp 4 base and --overlap-reduce alternated twice, the first round with
# timelines (rank 0's compute and side streams).
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/rb"
one() { # NAME DP [FLAGS...]
	local n=$1 dp=$2
	shift 2
	timeout 200 .devbin/1/rlbench --backend cuda --config examples/models/qwen2.5-3b/config.json --dp "$dp" --seqs $((8 * dp)) \
		--tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto \
		--cache /tmp/rbc -q --out "$OUT/rb/$n.json" "$@" >"$OUT/rb/$n.log" 2>&1
	say "$n rc=$? at ${SECONDS}s: $(tail -n 1 "$OUT/rb/$n.log" | cut -c1-260)"
}
one dp1-tl 1 --timeline "$OUT/rb/dp1.trace.json"
one dp4-base-tl 4 --timeline "$OUT/rb/dp4-base.trace.json"
one dp4-reduce-tl 4 --overlap-reduce --timeline "$OUT/rb/dp4-reduce.trace.json"
for r in 2 3; do
	((SECONDS < 470)) || break
	one dp4-base-$r 4
	one dp4-reduce-$r 4 --overlap-reduce
done
for f in "$OUT"/rb/*.trace.json; do
	python3 bench/trace_ops.py "$f" >"${f%.trace.json}.ops.md" 2>&1
done
(cd "$OUT" && tar czf r.tgz rb && rm -rf rb)
