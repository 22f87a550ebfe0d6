#!/usr/bin/env bash
# Call 9: the early host AdamW in updates of two micro-batches
# (--max-tokens-per-gpu 8192) without clipping, at the commit after
# bb3fcb9: early (default) against RLPIPE_EARLY_ADAMW=0, alternated, at
# 1.5B and 3B, the actor offloaded.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$* at ${SECONDS}s" | tee -a "$OUT/summary.txt"; }
left() { echo $((570 - SECONDS)); }
nvidia-smi -L >"$R/env.txt"; nproc >>"$R/env.txt"
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('grad_norm', j['last_metrics']['grad_norm'], 'train_s', j['train']['median_s'], 'train_tps', round(j['train']['tokens_per_s']), 'step_s', j.get('step',{}).get('median_s'))" "$1" 2>&1 | tail -1; }
for m in qwen2.5-1.5b qwen2.5-3b; do
	W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--max-tokens-per-gpu 8192 --warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --offload --no-grad-clip)
	reps=2
	[[ $m == qwen2.5-3b ]] && reps=1
	for rep in $(seq $reps); do
		for v in 1 0; do
			(($(left) < 110)) && break 3
			RLPIPE_EARLY_ADAMW=$v timeout 200 .devbin/N/rlbench "${W[@]}" --out "$R/$m-off2-noclip-early$v-$rep.json" >"$R/$m-off2-noclip-early$v-$rep.log" 2>&1
			say "$m offload 2 micro-batches no clip early=$v rep $rep rc=$? $(gn "$R/$m-off2-noclip-early$v-$rep.json")"
		done
	done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
