#!/usr/bin/env bash
# Call 4 (one H200): the actor's units kept gathered from forward to
# backward (rlbench --no-reshard: apply_fsdp2 reshard_after_forward false,
# one cast of each unit a step instead of two) against the default, at
# 1.5B and 3B, alternated three times; a timeline of each with it.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
B=.devbin/m4
one() { # NAME MODEL [args]
	timeout 100 $B/rlbench --backend cuda --config "examples/models/$2/config.json" --seqs 8 --tokens-per-seq 2048 \
		--prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q \
		--out "$OUT/r/$1.json" "${@:3}" >"$OUT/r/$1.log" 2>&1
	say "$1 rc=$? at ${SECONDS}s: $(tail -n 1 "$OUT/r/$1.log" | cut -c1-230)"
}
for r in 1 2 3; do
	for m in qwen2.5-1.5b qwen2.5-3b; do
		one $m-base-$r $m
		one $m-keep-$r $m --no-reshard
	done
done
for m in qwen2.5-1.5b qwen2.5-3b; do
	one $m-keep-tl $m --no-reshard --timeline "$OUT/r/$m-keep.trace.json"
	python3 bench/trace_ops.py "$OUT/r/$m-keep.trace.json" >"$OUT/r/$m-keep.ops.md" 2>&1
	sed -n '/## train/,$p' "$OUT/r/$m-keep.ops.md" | sed "s/^/$m.keep /" | tee -a "$OUT/summary.txt"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
