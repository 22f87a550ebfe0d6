#!/usr/bin/env bash
# Call 4 (one H200), build d4 (main at 8907e85 with calls/diag-nograds.patch,
# not committed): how long the GPU waits for the host's turn in each chunk
# of the train step's head (the log-probs down, the loss gradients
# computed, uploaded). RLPIPE_DIAG_NOGRADS unset: the step as it is;
# "sync": each chunk only waits for the device (no transfers, no Fill);
# "1": no wait at all (the gradients are wrong: a timing diagnostic).
# rlbench with a timeline at 1.5B and 3B for each, twice.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
one() { # NAME MODE MODEL
	RLPIPE_DIAG_NOGRADS=$2 timeout 120 .devbin/d4/rlbench --backend cuda --config "examples/models/$3/config.json" --seqs 8 --tokens-per-seq 2048 \
		--prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q \
		--out "$OUT/r/$1.json" --timeline "$OUT/r/$1.trace.json" >"$OUT/r/$1.log" 2>&1
	local rc=$?
	python3 bench/trace_ops.py "$OUT/r/$1.trace.json" >"$OUT/r/$1.ops.md" 2>&1
	say "$1 rc=$rc: $(tail -n 1 "$OUT/r/$1.log" | grep -o 'train [0-9]* tok/s') $(grep -E '## train|head forward-backward' "$OUT/r/$1.ops.md" | tr '\n' ' ')"
}
for r in 1 2; do
	for m in qwen2.5-1.5b qwen2.5-3b; do
		for mode in "" sync 1; do
			one $m-${mode:-normal}-$r "$mode" $m
		done
	done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
