#!/usr/bin/env bash
# Call 4 (four GPUs of one host), build r: where the replicated ref still
# loses at dp 4. rank 0's timelines (rlbench --timeline) of the 3B
# benchmark step at dp 1 and at dp 4 (the ref replicated, as the plan
# chooses), then bench/trace_ops.py on each; last the 1.5B at dp 4 with the
# ref sharded (--ref-replicate=false), which call 3 ran out of time for,
# against auto, alternated.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/rb"
one() { # NAME MODEL DP [FLAGS...]
	local n=$1 m=$2 dp=$3
	shift 3
	timeout 150 .devbin/r/rlbench --backend cuda --config "examples/models/$m/config.json" --dp $dp --seqs $((8 * dp)) \
		--tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto \
		--cache /tmp/rbc --out "$OUT/rb/$n.json" "$@" >"$OUT/rb/$n.log" 2>&1
	say "$n rc=$? at ${SECONDS}s: $(grep -o 'replicate of model ref: [a-z]*' "$OUT/rb/$n.log" | head -1); $(tail -n 1 "$OUT/rb/$n.log" | cut -c1-220)"
}
one 3b-dp1 qwen2.5-3b 1 --timeline "$OUT/rb/3b-dp1.trace.json"
one 3b-dp4 qwen2.5-3b 4 --timeline "$OUT/rb/3b-dp4.trace.json"
one 3b-dp4-shard qwen2.5-3b 4 --ref-replicate=false --timeline "$OUT/rb/3b-dp4-shard.trace.json"
for f in 3b-dp1 3b-dp4 3b-dp4-shard; do
	python3 bench/trace_ops.py "$OUT/rb/$f.trace.json" >"$OUT/rb/$f.ops.txt" 2>&1
done
grep -A3 -E '^#+ |ref_logp' "$OUT/rb/3b-dp4.ops.txt" | head -20 >>"$OUT/summary.txt"
for r in 1 2; do
	((SECONDS < 480)) || break
	one 1.5b-dp4-auto-$r qwen2.5-1.5b 4
	one 1.5b-dp4-shard-$r qwen2.5-1.5b 4 --ref-replicate=false
done
(cd "$OUT" && tar czf r.tgz rb && rm -rf rb)
