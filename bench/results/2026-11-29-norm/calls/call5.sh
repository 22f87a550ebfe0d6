#!/usr/bin/env bash
# Call 5 (one H200): where the one-rank gathers (casts) run. rlbench's
# GRPO step at 1.5B and 3B: the default (late gathers: issued when the
# layer before enters its MLP product; prefetch 1), RLPIPE_LATE_GATHERS=0
# (issued when the layer before starts), and --prefetch 2 (two units
# ahead), alternated twice.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
B=.devbin/g6
one() { # NAME LATE MODEL [args]
	RLPIPE_LATE_GATHERS=$2 timeout 100 $B/rlbench --backend cuda --config "examples/models/$3/config.json" --seqs 8 --tokens-per-seq 2048 \
		--prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q \
		--out "$OUT/r/$1.json" "${@:4}" >"$OUT/r/$1.log" 2>&1
	say "$1 rc=$? at ${SECONDS}s: $(tail -n 1 "$OUT/r/$1.log" | cut -c1-200)"
}
for r in 1 2; do
	for m in qwen2.5-1.5b qwen2.5-3b; do
		one $m-late-$r 1 $m
		one $m-early-$r 0 $m
		one $m-pf2-$r 1 $m --prefetch 2
	done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
