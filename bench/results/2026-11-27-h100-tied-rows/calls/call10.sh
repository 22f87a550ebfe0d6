#!/usr/bin/env bash
# Call 10: the tied rows in updates of several micro-batches (4177dd1,
# the tied rows' commit): stages' CUDA tests, then two
# micro-batches (--max-tokens-per-gpu 8192) with the actor offloaded,
# the rows (default) against RLPIPE_TIED_ROWS=0 (the embedding's whole
# grads added on the host), alternated, at 1.5B and 3B.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$* at ${SECONDS}s" | tee -a "$OUT/summary.txt"; }
left() { echo $((570 - SECONDS)); }
nvidia-smi -L >"$R/env.txt"; nproc >>"$R/env.txt"
(cd stages && timeout 120 ../.devbin/N/stages.test -test.run 'TestTiedRowsCUDA|TestEarlyUpdateCUDA$|TestRunTinyCUDA$' -test.v >"$R/stages-tests.txt" 2>&1)
say "stages tests rc=$? $(grep -E '^(--- |ok|FAIL)' "$R/stages-tests.txt" | tr '\n' ' ')"
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('grad_norm', j['last_metrics']['grad_norm'], 'train_s', j['train']['median_s'], 'train_tps', round(j['train']['tokens_per_s']), 'step_s', j.get('step',{}).get('median_s'))" "$1" 2>&1 | tail -1; }
for m in qwen2.5-1.5b qwen2.5-3b; do
	W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--max-tokens-per-gpu 8192 --warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --offload)
	reps=2
	[[ $m == qwen2.5-3b ]] && reps=1
	for rep in $(seq $reps); do
		for v in 1 0; do
			(($(left) < 110)) && break 3
			RLPIPE_TIED_ROWS=$v timeout 200 .devbin/N/rlbench "${W[@]}" --out "$R/$m-off2-rows$v-$rep.json" >"$R/$m-off2-rows$v-$rep.log" 2>&1
			say "$m offload 2 micro-batches rows=$v rep $rep rc=$? $(gn "$R/$m-off2-rows$v-$rep.json")"
		done
	done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
