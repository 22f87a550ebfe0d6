#!/usr/bin/env bash
# Call 3: apply_fsdp2's accumulate_grads_on_device (the tree committed
# after this call): stages' CUDA tests, then the offloaded 1.5B and 3B in
# updates of two micro-batches (--max-tokens-per-gpu 8192), the grads
# summed on the GPU (acc) against the host's adds (host), alternated, one
# binary; a resident run with the same micro-batches; a timeline of acc.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$* at ${SECONDS}s" | tee -a "$OUT/summary.txt"; }
left() { echo $((570 - SECONDS)); }
nvidia-smi -L >"$R/env.txt"; nproc >>"$R/env.txt"
(cd stages && timeout 150 ../.devbin/N/stages.test -test.run 'TestGradAccumulationCUDA|TestRunTinyCUDA$' -test.v >"$R/stages-tests.txt" 2>&1)
say "stages tests rc=$? $(grep -E '^(--- |ok|FAIL)' "$R/stages-tests.txt" | tr '\n' ' ')"
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('grad_norm', j['last_metrics']['grad_norm'], 'train_s', j['train']['median_s'], 'train_tps', round(j['train']['tokens_per_s']), 'step_s', j.get('step',{}).get('median_s'), 'plan_peak_gib', round(j.get('plan_peak_bytes',0)/2**30,2), 'hw_gib', round(j.get('arena_high_water_bytes',0)/2**30,2))" "$1" 2>&1 | tail -1; }
run() { # name extra args...
	local name=$1
	shift
	timeout 200 .devbin/N/rlbench "${W[@]}" "$@" --out "$R/$name.json" >"$R/$name.log" 2>&1
	say "$name rc=$? $(gn "$R/$name.json")"
}
m=qwen2.5-1.5b
W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --max-tokens-per-gpu 8192)
for rep in 1 2; do
	run $m-acc-$rep --offload --accumulate-grads-on-device
	run $m-host-$rep --offload
done
run $m-resident
m=qwen2.5-3b
W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --max-tokens-per-gpu 8192)
(($(left) > 100)) && run $m-acc --offload --accumulate-grads-on-device
(($(left) > 90)) && run $m-host --offload
(($(left) > 80)) && run $m-resident
if (($(left) > 40)); then
	m=qwen2.5-1.5b
	W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --max-tokens-per-gpu 8192)
	run $m-acc-tl --offload --accumulate-grads-on-device --timeline "$R/acc.trace.json"
	python3 bench/trace_ops.py "$R/acc.trace.json" --top 16 >"$R/ops.txt" 2>&1
fi
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
