#!/usr/bin/env bash
# Call 3: M is main before this work (f8ddd74); N the working tree: the
# host's bf16 copy of offloaded masters, written by the fused AdamW
# kernel (regular stores again), and the host AdamW's work handed out to
# its workers in 1 MiB tasks instead of one contiguous chunk each. The
# AdamW benchmark of N; the offloaded 3B of M, N with the copy and N
# without it (RLPIPE_HOST_BF16=0), alternated; the resident 3B of N; a
# timeline of N's offloaded step.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$* at ${SECONDS}s" | tee -a "$OUT/summary.txt"; }
left() { echo $((575 - SECONDS)); }
(cd gpu/cpu && timeout 60 ../../.devbin/N/cpu.test -test.run XXX -test.bench 'AdamW/adamw' -test.benchtime 10x -test.count 2 >"$R/adamw-bench.txt" 2>&1)
say "adamw bench rc=$? $(grep Bench "$R/adamw-bench.txt" | awk '{print $1, $3, $5}' | tr '\n' ' ')"
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc)
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('grad_norm', j['last_metrics']['grad_norm'], 'ref_s', j['ref_logprob']['median_s'], 'train_s', j['train']['median_s'], 'train_tps', round(j['train']['tokens_per_s']))" "$1" 2>&1 | tail -1; }
i=0
for rep in 1 2; do
	for m in main copy nocopy; do
		(($(left) < 110)) && break 2
		i=$((i + 1))
		b=N v=1
		[[ $m == main ]] && b=M
		[[ $m == nocopy ]] && v=0
		RLPIPE_HOST_BF16=$v timeout 150 .devbin/$b/rlbench "${W[@]}" --offload --out "$R/off-$m-$i.json" >"$R/off-$m-$i.log" 2>&1
		say "offload $m run $i rc=$? $(gn "$R/off-$m-$i.json")"
	done
done
if (($(left) > 60)); then
	timeout 60 .devbin/N/rlbench "${W[@]}" --out "$R/resident.json" >"$R/resident.log" 2>&1
	say "resident rc=$? $(gn "$R/resident.json")"
fi
if (($(left) > 45)); then
	W[13]=1 W[15]=2
	timeout $(($(left) - 5)) .devbin/N/rlbench "${W[@]}" --offload --out "$R/tl.json" --timeline "$R/off.trace.json" >"$R/tl.log" 2>&1
	say "timeline rc=$? $(gn "$R/tl.json")"
	python3 bench/trace_ops.py "$R/off.trace.json" --top 14 >"$R/ops.txt" 2>&1
fi
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
