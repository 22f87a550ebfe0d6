#!/usr/bin/env bash
# Call 1: N is the working tree with the host's bf16 copy of offloaded
# masters (the gathers copy it instead of the fp32 master). The host
# AdamW benchmark (adamw, adamw with the bf16 copy, the cast alone); the
# CUDA stage tests (TestHostBF16CUDA, TestRunTinyCUDA, TestHostUpdateOverlap);
# the offloaded 3B with the copy (default) and without (RLPIPE_HOST_BF16=0)
# alternated, the resident 3B, and a timeline of the offloaded step with
# the copy.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$* at ${SECONDS}s" | tee -a "$OUT/summary.txt"; }
left() { echo $((570 - SECONDS)); }
{ nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv; nproc; free -g; lscpu | head -20; } >"$R/env.txt" 2>&1
(cd gpu/cpu && timeout 60 ../../.devbin/N/cpu.test -test.run XXX -test.bench 'AdamW/' -test.benchtime 10x -test.count 2 >"$R/adamw-bench.txt" 2>&1)
say "adamw bench rc=$? $(grep Bench "$R/adamw-bench.txt" | awk '{print $1, $3, $5}' | tr '\n' ' ')"
(cd stages && timeout 200 ../.devbin/N/stages.test -test.run 'TestHostBF16CUDA|TestRunTinyCUDA$|TestHostUpdateOverlap' -test.v >"$R/stages.log" 2>&1)
say "stage tests rc=$? $(grep -E '^(--- FAIL|--- PASS|--- SKIP|FAIL|PASS|ok)' "$R/stages.log" | tr '\n' ' ')"
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc)
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('grad_norm', j['last_metrics']['grad_norm'], 'ref_s', j['ref_logprob']['median_s'], 'train_s', j['train']['median_s'], 'train_tps', round(j['train']['tokens_per_s']))" "$1" 2>&1 | tail -1; }
i=0
for rep in 1 2; do
	for m in copy nocopy; do
		(($(left) < 150)) && break 2
		i=$((i + 1))
		v=1
		[[ $m == nocopy ]] && v=0
		RLPIPE_HOST_BF16=$v timeout 150 .devbin/N/rlbench "${W[@]}" --offload --out "$R/off-$m-$i.json" >"$R/off-$m-$i.log" 2>&1
		say "offload $m run $i rc=$? $(gn "$R/off-$m-$i.json")"
	done
done
if (($(left) > 100)); then
	timeout 100 .devbin/N/rlbench "${W[@]}" --out "$R/resident.json" >"$R/resident.log" 2>&1
	say "resident rc=$? $(gn "$R/resident.json")"
fi
if (($(left) > 70)); then
	W[13]=1 W[15]=2
	timeout $(($(left) - 10)) .devbin/N/rlbench "${W[@]}" --offload --out "$R/tl.json" --timeline "$R/off.trace.json" >"$R/tl.log" 2>&1
	say "timeline rc=$? $(gn "$R/tl.json")"
	python3 bench/trace_ops.py "$R/off.trace.json" --top 14 >"$R/ops.txt" 2>&1
	head -60 "$R/ops.txt" >>"$OUT/summary.txt"
fi
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
