#!/usr/bin/env bash
# Call 5: updates of two micro-batches (--max-tokens-per-gpu 8192) with
# the actor offloaded, at f0c3315: the default, apply_fsdp2's
# host_bf16_copy (the gathers copy a bf16 copy of the masters: half the
# bytes across PCIe), reshard_after_forward false (units stay gathered
# from a micro-batch's forward to its backward), and both; the 3B default
# and with the copy. A PCIe-bound step: each micro-batch gathers every
# unit twice.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$* at ${SECONDS}s" | tee -a "$OUT/summary.txt"; }
left() { echo $((570 - SECONDS)); }
nvidia-smi -L >"$R/env.txt"; nproc >>"$R/env.txt"
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); m=j['memory']; print('grad_norm', j['last_metrics']['grad_norm'], 'train_s', j['train']['median_s'], 'train_tps', round(j['train']['tokens_per_s']), 'step_s', j.get('step',{}).get('median_s'), 'plan_GiB', round(m['plan_peak_bytes']/2**30,2), 'hw_GiB', round(m['arena_high_water_bytes']/2**30,2))" "$1" 2>&1 | tail -1; }
for m in qwen2.5-1.5b qwen2.5-3b; do
	W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--max-tokens-per-gpu 8192 --warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --offload)
	kinds="default copy noreshard both"
	[[ $m == qwen2.5-3b ]] && kinds="default copy"
	for k in $kinds; do
		(($(left) < 100)) && break 2
		X=()
		[[ $k == copy || $k == both ]] && X+=(--host-bf16-copy)
		[[ $k == noreshard || $k == both ]] && X+=(--no-reshard)
		timeout 200 .devbin/N/rlbench "${W[@]}" "${X[@]}" --out "$R/$m-off-$k.json" >"$R/$m-off-$k.log" 2>&1
		say "$m offload 2 micro-batches $k rc=$? $(gn "$R/$m-off-$k.json")"
	done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
