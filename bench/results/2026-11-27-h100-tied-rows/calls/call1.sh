#!/usr/bin/env bash
# Call 1: N is e7fa178 + the RLPIPE_TIED_ROWS switch (the tied embedding's
# grads reach the host as the head's early copy plus the touched rows of
# the total). The CUDA tests of the change, then the offloaded 1.5B and 3B
# with the rows (default) and without (RLPIPE_TIED_ROWS=0: main's host
# add), alternated, and the resident runs.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$* at ${SECONDS}s" | tee -a "$OUT/summary.txt"; }
left() { echo $((570 - SECONDS)); }
nvidia-smi -L >"$R/env.txt"; nproc >>"$R/env.txt"
(cd gpu/cuda && timeout 60 ../../.devbin/N/cuda.test -test.run 'TestCopyRows|TestEmbedding$' -test.v >"$R/cuda-tests.txt" 2>&1)
say "cuda tests rc=$? $(grep -E '^(--- |ok|FAIL)' "$R/cuda-tests.txt" | tr '\n' ' ')"
(cd stages && timeout 150 ../.devbin/N/stages.test -test.run 'TestTiedRowsCUDA|TestRunTinyCUDA$|TestHostBF16CUDA' -test.v >"$R/stages-tests.txt" 2>&1)
say "stages tests rc=$? $(grep -E '^(--- |ok|FAIL)' "$R/stages-tests.txt" | tr '\n' ' ')"
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('grad_norm', j['last_metrics']['grad_norm'], 'train_s', j['train']['median_s'], 'train_tps', round(j['train']['tokens_per_s']), 'step_s', j.get('step',{}).get('median_s'))" "$1" 2>&1 | tail -1; }
for m in qwen2.5-1.5b qwen2.5-3b; do
	W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc)
	reps=2
	[[ $m == qwen2.5-3b ]] && reps=1
	for rep in $(seq $reps); do
		for v in 1 0; do
			(($(left) < 100)) && break 3
			RLPIPE_TIED_ROWS=$v timeout 150 .devbin/N/rlbench "${W[@]}" --offload --out "$R/$m-off-rows$v-$rep.json" >"$R/$m-off-rows$v-$rep.log" 2>&1
			say "$m offload rows=$v rep $rep rc=$? $(gn "$R/$m-off-rows$v-$rep.json")"
		done
	done
	(($(left) < 70)) && break
	timeout 90 .devbin/N/rlbench "${W[@]}" --out "$R/$m-resident.json" >"$R/$m-resident.log" 2>&1
	say "$m resident rc=$? $(gn "$R/$m-resident.json")"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
