#!/usr/bin/env bash
# Call 2 (two GPUs): gather_once left to auto against written false at
# dp 2 over NCCL, the 1.5B resident, in updates of one micro-batch a rank
# (8 x 2048 tokens over 2 ranks) and of two (--max-tokens-per-gpu 4096);
# then, on one GPU, the ref offloaded (--offload-ref) in steps of two
# micro-batches: the ref's gather_once auto against false; and the actor
# offloaded in updates of one micro-batch, auto against both options
# false, at 3B (which call 1's build could not fit) and 1.5B. The build
# ends a kept unit's staging buffers at its first use (call 1's kept them
# to the backward). One binary, each pair alternated.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$* at ${SECONDS}s" | tee -a "$OUT/summary.txt"; }
left() { echo $((570 - SECONDS)); }
nvidia-smi -L >"$R/env.txt"; nproc >>"$R/env.txt"; nvidia-smi topo -m >>"$R/env.txt" 2>&1
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); m=j['memory']; a=j['workload'].get('auto') or []; print('grad_norm', j['last_metrics']['grad_norm'], 'ref_s', j['ref_logprob']['median_s'], 'train_s', j['train']['median_s'], 'train_tps', round(j['train']['tokens_per_s']), 'step_s', j.get('step',{}).get('median_s'), 'plan_gib', round(m['plan_peak_bytes']/2**30,2), 'hw_gib', round(m['arena_high_water_bytes']/2**30,2), 'auto', ';'.join(c['subject']+' '+c['key']+'='+c['value'] for c in a if c['key'] in ('gather_once','accumulate_grads_on_device')))" "$1" 2>&1 | tail -1; }
run() { # name extra args...
	local name=$1
	shift
	timeout 150 .devbin/N/rlbench "${W[@]}" "$@" --out "$R/$name.json" >"$R/$name.log" 2>&1
	say "$name rc=$? $(gn "$R/$name.json")"
}
m=qwen2.5-1.5b
for tok in 16384 4096; do
	W=(--backend cuda --dp 2 --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc --max-tokens-per-gpu $tok)
	for i in 1 2; do
		(($(left) > 60)) && run dp2-$tok-auto-$i
		(($(left) > 60)) && run dp2-$tok-off-$i --gather-once=false
	done
done
for m in qwen2.5-1.5b qwen2.5-3b; do
	W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --max-tokens-per-gpu 8192 --offload-ref)
	(($(left) > 60)) && run $m-offref-auto
	(($(left) > 60)) && run $m-offref-off --ref-gather-once=false
done
for m in qwen2.5-3b qwen2.5-1.5b; do
	W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc)
	(($(left) > 60)) && run $m-16384-auto --offload
	(($(left) > 60)) && run $m-16384-off --offload --gather-once=false --accumulate-grads-on-device=false
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
