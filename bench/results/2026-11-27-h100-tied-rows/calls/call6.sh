#!/usr/bin/env bash
# Call 6: the host adds of offloaded grads in AVX2 (5ac1fd9, N) against
# f0c3315 (M): BenchmarkAddScaled (N, and N with RLPIPE_CPU_SCALAR=1),
# then updates of two micro-batches (--max-tokens-per-gpu 8192) with the
# actor offloaded, M and N alternated, at 1.5B and 3B.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$* at ${SECONDS}s" | tee -a "$OUT/summary.txt"; }
left() { echo $((570 - SECONDS)); }
nvidia-smi -L >"$R/env.txt"; nproc >>"$R/env.txt"
(cd gpu/cpu && timeout 60 ../../.devbin/N/cpu.test -test.run XXX -test.bench 'AddScaled' -test.benchtime 20x -test.count 2 >"$R/add-bench.txt" 2>&1
	RLPIPE_CPU_SCALAR=1 timeout 60 ../../.devbin/N/cpu.test -test.run XXX -test.bench 'AddScaled' -test.benchtime 20x -test.count 2 >"$R/add-bench-scalar.txt" 2>&1)
say "add bench: $(grep Bench "$R/add-bench.txt" | awk '{print $3, $5}' | tr '\n' ' ') scalar: $(grep Bench "$R/add-bench-scalar.txt" | awk '{print $3, $5}' | tr '\n' ' ')"
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('grad_norm', j['last_metrics']['grad_norm'], 'train_s', j['train']['median_s'], 'train_tps', round(j['train']['tokens_per_s']), 'step_s', j.get('step',{}).get('median_s'))" "$1" 2>&1 | tail -1; }
for m in qwen2.5-1.5b qwen2.5-3b; do
	W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--max-tokens-per-gpu 8192 --warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --offload)
	reps=2
	[[ $m == qwen2.5-3b ]] && reps=1
	for rep in $(seq $reps); do
		for b in M N; do
			(($(left) < 110)) && break 3
			timeout 200 .devbin/$b/rlbench "${W[@]}" --out "$R/$m-off-$b-$rep.json" >"$R/$m-off-$b-$rep.log" 2>&1
			say "$m offload 2 micro-batches $b rep $rep rc=$? $(gn "$R/$m-off-$b-$rep.json")"
		done
	done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
