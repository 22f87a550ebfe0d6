#!/usr/bin/env bash
# Call 3 (one H200): what the one-rank gathers (the casts of the actor's
# fp32 masters to bf16, on the side stream beside the products) cost the
# train step. A diagnostic build (calls/diag-no-side.patch, not committed):
# RLPIPE_DIAG_NO_SIDE=1 leaves the rank without a side stream, so every
# gather runs on the compute stream, in its own span. rlbench's GRPO step
# at 1.5B and 3B both ways, alternated twice, then a timeline of each.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
B=.devbin/d3
one() { # NAME NOSIDE MODEL [args]
	RLPIPE_DIAG_NO_SIDE=$2 timeout 100 $B/rlbench --backend cuda --config "examples/models/$3/config.json" --seqs 8 --tokens-per-seq 2048 \
		--prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q \
		--out "$OUT/r/$1.json" "${@:4}" >"$OUT/r/$1.log" 2>&1
	say "$1 rc=$? at ${SECONDS}s: $(tail -n 1 "$OUT/r/$1.log" | cut -c1-230)"
}
for r in 1 2; do
	for m in qwen2.5-1.5b qwen2.5-3b; do
		one $m-side-$r 0 $m
		one $m-noside-$r 1 $m
	done
done
for m in qwen2.5-1.5b qwen2.5-3b; do
	for v in 0 1; do
		one $m-tl$v $v $m --timeline "$OUT/r/$m-$v.trace.json"
		python3 bench/trace_ops.py "$OUT/r/$m-$v.trace.json" >"$OUT/r/$m-$v.ops.md" 2>&1
		sed -n '/## train/,$p' "$OUT/r/$m-$v.ops.md" | sed "s/^/$m.$v /" | tee -a "$OUT/summary.txt"
	done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
