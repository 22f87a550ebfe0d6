#!/usr/bin/env bash
# Call 1: the host workers yield between tasks, and the host's grad adds
# run on the background backend (a core fewer). N is the change, M main
# before it (3e3c6d5); N with RLPIPE_CPU_YIELD=0 keeps the adds' core
# change but not the yield. CPU benchmarks, stages' CUDA tests, then the
# offloaded 1.5B and 3B with two micro-batches (--max-tokens-per-gpu
# 8192), with and without clipping, and with one micro-batch.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$* at ${SECONDS}s" | tee -a "$OUT/summary.txt"; }
left() { echo $((570 - SECONDS)); }
nvidia-smi -L >"$R/env.txt"; nproc >>"$R/env.txt"
(cd gpu/cpu && timeout 60 ../../.devbin/N/cpu.test -test.run XXX -test.bench 'WakeDuringAdds|AddScaled' -test.benchtime 2s >"$R/cpu-bench.txt" 2>&1)
say "cpu bench rc=$? $(grep -E '^Bench' "$R/cpu-bench.txt" | tr -s ' ' | tr '\n' ';')"
(cd stages && timeout 120 ../.devbin/N/stages.test -test.run 'TestTiedRowsCUDA|TestEarlyUpdateCUDA$|TestRunTinyCUDA$' -test.v >"$R/stages-tests.txt" 2>&1)
say "stages tests rc=$? $(grep -E '^(--- |ok|FAIL)' "$R/stages-tests.txt" | tr '\n' ' ')"
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('grad_norm', j['last_metrics']['grad_norm'], 'train_s', j['train']['median_s'], 'train_tps', round(j['train']['tokens_per_s']), 'step_s', j.get('step',{}).get('median_s'))" "$1" 2>&1 | tail -1; }
run() { # name binary env-yield extra args...
	local name=$1 bin=$2 y=$3
	shift 3
	RLPIPE_CPU_YIELD=$y timeout 200 .devbin/$bin/rlbench "${W[@]}" "$@" --out "$R/$name.json" >"$R/$name.log" 2>&1
	say "$name rc=$? $(gn "$R/$name.json")"
}
m=qwen2.5-1.5b
W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --offload)
for rep in 1 2; do
	run $m-mb2-N-$rep N 1 --max-tokens-per-gpu 8192
	run $m-mb2-N0-$rep N 0 --max-tokens-per-gpu 8192
	run $m-mb2-M-$rep M 1 --max-tokens-per-gpu 8192
done
run $m-mb2-noclip-N N 1 --max-tokens-per-gpu 8192 --no-grad-clip
run $m-mb2-noclip-M M 1 --max-tokens-per-gpu 8192 --no-grad-clip
run $m-mb1-N N 1
run $m-mb1-M M 1
run $m-mb1-noclip-N N 1 --no-grad-clip
run $m-mb1-noclip-M M 1 --no-grad-clip
if (($(left) > 150)); then
	m=qwen2.5-3b
	W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --offload)
	run $m-mb2-N N 1 --max-tokens-per-gpu 8192
	(($(left) > 70)) && run $m-mb2-M M 1 --max-tokens-per-gpu 8192
fi
if (($(left) > 45)); then
	m=qwen2.5-1.5b
	W=(--backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--warmup 1 --steps 2 --precision bf16 --recompute-auto --cache /tmp/rbc --offload)
	run $m-mb2-N-tl N 1 --max-tokens-per-gpu 8192 --timeline "$R/off2.trace.json"
	python3 bench/trace_ops.py "$R/off2.trace.json" --top 16 >"$R/ops.txt" 2>&1
fi
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
