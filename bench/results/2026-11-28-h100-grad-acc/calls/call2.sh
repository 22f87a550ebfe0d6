#!/usr/bin/env bash
# Call 2: how many host threads the host's grad adds (two micro-batches)
# and the background AdamW (one micro-batch) should use, when PCIe DMA
# shares the host's memory with them. One build (the tree at call 2 with
# the experiment's RLPIPE_HOST_ADD_THREADS and RLPIPE_HOST_ADAMW_THREADS
# knobs); the offloaded 1.5B and 3B.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$* at ${SECONDS}s" | tee -a "$OUT/summary.txt"; }
left() { echo $((570 - SECONDS)); }
nvidia-smi -L >"$R/env.txt"; nproc >>"$R/env.txt"
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('grad_norm', j['last_metrics']['grad_norm'], 'train_s', j['train']['median_s'], 'train_tps', round(j['train']['tokens_per_s']), 'step_s', j.get('step',{}).get('median_s'))" "$1" 2>&1 | tail -1; }
run() { # name add-threads adamw-threads extra args...
	local name=$1 a=$2 w=$3
	shift 3
	RLPIPE_HOST_ADD_THREADS=$a RLPIPE_HOST_ADAMW_THREADS=$w timeout 200 .devbin/N/rlbench "${W[@]}" "$@" --out "$R/$name.json" >"$R/$name.log" 2>&1
	say "$name rc=$? $(gn "$R/$name.json")"
}
m=qwen2.5-1.5b
W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --offload)
for rep in 1 2; do
	for a in 16 8 4 2; do
		run $m-mb2-add$a-$rep $a 0 --max-tokens-per-gpu 8192
	done
done
for w in 15 8 4; do
	run $m-mb1-adamw$w $w $w
done
m=qwen2.5-3b
W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --offload)
for a in 16 4; do
	(($(left) > 60)) && run $m-mb2-add$a $a 0 --max-tokens-per-gpu 8192
done
for w in 15 6; do
	(($(left) > 50)) && run $m-mb1-adamw$w 0 $w
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
