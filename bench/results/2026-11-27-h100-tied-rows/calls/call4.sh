#!/usr/bin/env bash
# Call 4: updates of two micro-batches (--max-tokens-per-gpu 8192: 2 × 4
# sequences of 2048 tokens) with the actor offloaded, whose later
# micro-batch's grads the host adds in (stages/hostadd.go). M is main
# before this session (56f90c8: each chunk's waiter held the CUDA driver's
# thread in cuEventSynchronize); N is f0c3315 (the waiters poll the
# events). Alternated, then the resident runs and a timeline of N.
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
		--max-tokens-per-gpu 8192 --warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc)
	reps=2
	[[ $m == qwen2.5-3b ]] && reps=1
	for rep in $(seq $reps); do
		for b in M N; do
			(($(left) < 120)) && break 3
			timeout 200 .devbin/$b/rlbench "${W[@]}" --offload --out "$R/$m-off-$b-$rep.json" >"$R/$m-off-$b-$rep.log" 2>&1
			say "$m offload 2 micro-batches $b rep $rep rc=$? $(gn "$R/$m-off-$b-$rep.json")"
		done
	done
	(($(left) < 60)) && break
	timeout 90 .devbin/N/rlbench "${W[@]}" --out "$R/$m-resident.json" >"$R/$m-resident.log" 2>&1
	say "$m resident 2 micro-batches rc=$? $(gn "$R/$m-resident.json")"
	if [[ $m == qwen2.5-1.5b ]] && (($(left) > 250)); then
		timeout 90 .devbin/N/rlbench "${W[@]}" --offload --timeline "$R/off2.trace.json" --out "$R/$m-off-tl.json" >"$R/$m-off-tl.log" 2>&1
		say "$m offload timeline rc=$? $(gn "$R/$m-off-tl.json")"
		python3 bench/trace_ops.py "$R/off2.trace.json" --top 16 >"$R/ops.txt" 2>&1
	fi
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
