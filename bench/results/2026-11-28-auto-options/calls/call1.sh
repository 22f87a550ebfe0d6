#!/usr/bin/env bash
# Call 1: apply_fsdp2's gather_once and accumulate_grads_on_device left to
# auto (the new default) against both written false (the old default),
# the actor offloaded, at 1.5B and 3B, in updates of one micro-batch
# (16384 tokens) and of two (--max-tokens-per-gpu 8192), with the
# resident run of each for the ratio; one binary, the three runs of a row
# alternated. Then the stages' CUDA tests of both options.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$* at ${SECONDS}s" | tee -a "$OUT/summary.txt"; }
left() { echo $((560 - SECONDS)); }
nvidia-smi -L >"$R/env.txt"; nproc >>"$R/env.txt"
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); m=j['memory']; a=j['workload'].get('auto') or []; print('grad_norm', j['last_metrics']['grad_norm'], 'ref_s', j['ref_logprob']['median_s'], 'train_s', j['train']['median_s'], 'train_tps', round(j['train']['tokens_per_s']), 'step_s', j.get('step',{}).get('median_s'), 'plan_gib', round(m['plan_peak_bytes']/2**30,2), 'hw_gib', round(m['arena_high_water_bytes']/2**30,2), 'auto', ';'.join(c['subject']+' '+c['key']+'='+c['value'] for c in a if c['key'] in ('gather_once','accumulate_grads_on_device')))" "$1" 2>&1 | tail -1; }
run() { # name extra args...
	local name=$1
	shift
	timeout 150 .devbin/N/rlbench "${W[@]}" "$@" --out "$R/$name.json" >"$R/$name.log" 2>&1
	say "$name rc=$? $(gn "$R/$name.json")"
}
for m in qwen2.5-1.5b qwen2.5-3b; do
	for tok in 16384 8192; do
		W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
			--warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --max-tokens-per-gpu $tok)
		(($(left) > 60)) && run $m-$tok-auto --offload
		(($(left) > 60)) && run $m-$tok-off --offload --gather-once=false --accumulate-grads-on-device=false
		(($(left) > 60)) && run $m-$tok-resident
	done
done
if (($(left) > 40)); then
	(cd stages && timeout 60 ../.devbin/N/stages.test -test.run 'TestGatherOnceCUDA|TestGradAccumulationCUDA' -test.v >"$R/stages-tests.txt" 2>&1)
	say "stages tests rc=$? $(grep -E '^(--- |ok|FAIL)' "$R/stages-tests.txt" | tr '\n' ' ')"
fi
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
