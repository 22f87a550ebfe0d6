#!/usr/bin/env bash
# Call 3: the final build (gather_once auto only where a stage may have
# several micro-batches; a kept unit's staging ends at its first use):
# the stages' CUDA tests of both options, then the actor offloaded at
# 1.5B and 3B in updates of two micro-batches, auto against both options
# false, twice each, alternated, with a resident run; then the ref
# offloaded in steps of two micro-batches at 3B, its gather_once auto
# against false.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$* at ${SECONDS}s" | tee -a "$OUT/summary.txt"; }
left() { echo $((560 - SECONDS)); }
nvidia-smi -L >"$R/env.txt"; nproc >>"$R/env.txt"
(cd stages && timeout 90 ../.devbin/N/stages.test -test.run 'TestGatherOnceCUDA|TestGradAccumulationCUDA' -test.v >"$R/stages-tests.txt" 2>&1)
say "stages tests rc=$? $(grep -E '^(--- |ok|FAIL)' "$R/stages-tests.txt" | tr '\n' ' ')"
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); m=j['memory']; a=j['workload'].get('auto') or []; print('grad_norm', j['last_metrics']['grad_norm'], 'ref_s', j['ref_logprob']['median_s'], 'train_s', j['train']['median_s'], 'train_tps', round(j['train']['tokens_per_s']), 'step_s', j.get('step',{}).get('median_s'), 'plan_gib', round(m['plan_peak_bytes']/2**30,2), 'hw_gib', round(m['arena_high_water_bytes']/2**30,2), 'auto', ';'.join(c['subject']+' '+c['key']+'='+c['value'] for c in a if c['key'] in ('gather_once','accumulate_grads_on_device')))" "$1" 2>&1 | tail -1; }
run() { # name extra args...
	local name=$1
	shift
	timeout 150 .devbin/N/rlbench "${W[@]}" "$@" --out "$R/$name.json" >"$R/$name.log" 2>&1
	say "$name rc=$? $(gn "$R/$name.json")"
}
for m in qwen2.5-1.5b qwen2.5-3b; do
	W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc --max-tokens-per-gpu 8192)
	for i in 1 2; do
		(($(left) > 60)) && run $m-8192-auto-$i --offload
		(($(left) > 60)) && run $m-8192-off-$i --offload --gather-once=false --accumulate-grads-on-device=false
	done
	(($(left) > 60)) && run $m-8192-resident
done
m=qwen2.5-3b
W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc --max-tokens-per-gpu 8192 --offload-ref)
(($(left) > 60)) && run $m-offref-auto
(($(left) > 60)) && run $m-offref-off --ref-gather-once=false
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
