#!/usr/bin/env bash
# Call 6 (one H200), build c6 (= c5): apply_fsdp2's gather_once at dp 1
# (params on the device), which auto leaves off there ("its gathers stay
# on the device"): the train step with --gather-once=true against the
# default, alternated, 1.5B and 3B.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
one() { # NAME MODEL [FLAGS...]
	timeout 100 .devbin/c6/rlbench --backend cuda --config "examples/models/$2/config.json" --seqs 8 --tokens-per-seq 2048 \
		--prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q \
		--out "$OUT/r/$1.json" "${@:3}" >"$OUT/r/$1.log" 2>&1
	say "$1 rc=$? at ${SECONDS}s: $(tail -n 1 "$OUT/r/$1.log" | cut -c1-250)"
}
for r in 1 2; do
	for m in qwen2.5-1.5b qwen2.5-3b; do
		((SECONDS < 330)) || break
		one $m-once-$r $m --gather-once=true
		one $m-auto-$r $m
	done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
