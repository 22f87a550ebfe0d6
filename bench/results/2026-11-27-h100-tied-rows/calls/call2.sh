#!/usr/bin/env bash
# Call 2: N is the working tree after call 1 with the early host AdamW:
# without gradient clipping (rlbench --no-grad-clip: train.grad_clip 0),
# each unit's host AdamW starts as its grads reach the host
# (RLPIPE_EARLY_ADAMW=0: started by the optimizer op, as before); the
# updater polls the Down stream's events (cuda Event.Query) instead of
# holding the driver thread in cuEventSynchronize. The CUDA tests, then the
# offloaded 1.5B and 3B without clipping, early and not, alternated, the
# resident runs without clipping, and the offloaded 1.5B with clipping.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$* at ${SECONDS}s" | tee -a "$OUT/summary.txt"; }
left() { echo $((570 - SECONDS)); }
nvidia-smi -L >"$R/env.txt"; nproc >>"$R/env.txt"
(cd gpu/cuda && timeout 60 ../../.devbin/N/cuda.test -test.run 'TestEventQuery|TestCopyRows' -test.v >"$R/cuda-tests.txt" 2>&1)
say "cuda tests rc=$? $(grep -E '^(--- |ok|FAIL)' "$R/cuda-tests.txt" | tr '\n' ' ')"
(cd stages && timeout 150 ../.devbin/N/stages.test -test.run 'TestEarlyUpdateCUDA|TestTiedRowsCUDA|TestRunTinyCUDA$' -test.v >"$R/stages-tests.txt" 2>&1)
say "stages tests rc=$? $(grep -E '^(--- |ok|FAIL)' "$R/stages-tests.txt" | tr '\n' ' ')"
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('grad_norm', j['last_metrics']['grad_norm'], 'train_s', j['train']['median_s'], 'train_tps', round(j['train']['tokens_per_s']), 'step_s', j.get('step',{}).get('median_s'))" "$1" 2>&1 | tail -1; }
for m in qwen2.5-1.5b qwen2.5-3b; do
	W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc)
	reps=2
	[[ $m == qwen2.5-3b ]] && reps=1
	for rep in $(seq $reps); do
		for v in 1 0; do
			(($(left) < 90)) && break 3
			RLPIPE_EARLY_ADAMW=$v timeout 150 .devbin/N/rlbench "${W[@]}" --offload --no-grad-clip --out "$R/$m-off-noclip-early$v-$rep.json" >"$R/$m-off-noclip-early$v-$rep.log" 2>&1
			say "$m offload no clip early=$v rep $rep rc=$? $(gn "$R/$m-off-noclip-early$v-$rep.json")"
		done
	done
	(($(left) < 60)) && break
	timeout 90 .devbin/N/rlbench "${W[@]}" --no-grad-clip --out "$R/$m-resident-noclip.json" >"$R/$m-resident-noclip.log" 2>&1
	say "$m resident no clip rc=$? $(gn "$R/$m-resident-noclip.json")"
	if [[ $m == qwen2.5-1.5b ]] && (($(left) > 200)); then
		timeout 60 .devbin/N/rlbench "${W[@]}" --offload --out "$R/$m-off-clip.json" >"$R/$m-off-clip.log" 2>&1
		say "$m offload clip rc=$? $(gn "$R/$m-off-clip.json")"
	fi
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
