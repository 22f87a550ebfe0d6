#!/usr/bin/env bash
# Call 4: apply_fsdp2's gather_once (the tree committed after this
# call): stages' CUDA tests, then the offloaded 1.5B and 3B in updates
# of two micro-batches (--max-tokens-per-gpu 8192), all with the grads
# summed on the GPU (--accumulate-grads-on-device): gathered for each use
# (acc), once an update (once), and once from the host's bf16 copy
# (once-bf16); one binary, alternated; a timeline of once at 1.5B.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$* at ${SECONDS}s" | tee -a "$OUT/summary.txt"; }
left() { echo $((380 - SECONDS)); }
nvidia-smi -L >"$R/env.txt"; nproc >>"$R/env.txt"
(cd stages && timeout 100 ../.devbin/N/stages.test -test.run 'TestGatherOnceCUDA|TestGradAccumulationCUDA' -test.v >"$R/stages-tests.txt" 2>&1)
say "stages tests rc=$? $(grep -E '^(--- |ok|FAIL)' "$R/stages-tests.txt" | tr '\n' ' ')"
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); m=j['memory']; print('grad_norm', j['last_metrics']['grad_norm'], 'train_s', j['train']['median_s'], 'train_tps', round(j['train']['tokens_per_s']), 'step_s', j.get('step',{}).get('median_s'), 'plan_gib', round(m['plan_peak_bytes']/2**30,2), 'hw_gib', round(m['arena_high_water_bytes']/2**30,2))" "$1" 2>&1 | tail -1; }
run() { # name extra args...
	local name=$1
	shift
	timeout 150 .devbin/N/rlbench "${W[@]}" "$@" --out "$R/$name.json" >"$R/$name.log" 2>&1
	say "$name rc=$? $(gn "$R/$name.json")"
}
for m in qwen2.5-1.5b qwen2.5-3b; do
	W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --max-tokens-per-gpu 8192 --offload --accumulate-grads-on-device)
	(($(left) > 60)) && run $m-once --gather-once
	(($(left) > 60)) && run $m-acc
	(($(left) > 60)) && run $m-once-bf16 --gather-once --host-bf16-copy
done
if (($(left) > 30)); then
	m=qwen2.5-1.5b
	W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --max-tokens-per-gpu 8192 --offload --accumulate-grads-on-device)
	run $m-once-tl --gather-once --timeline "$R/once.trace.json"
	python3 bench/trace_ops.py "$R/once.trace.json" --top 16 >"$R/ops.txt" 2>&1
	python3 bench/trace_ops.py "$R/once.trace.json" --backward train >>"$R/ops.txt" 2>&1
fi
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
