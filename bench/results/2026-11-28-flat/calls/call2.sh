#!/usr/bin/env bash
# Call 2 (one H200), build c2 (main at 423563e; rlbench as in call 1): the
# GPU's square bf16 product rate (bench/gemm_peak.py), best against best
# at 1.5B and 3B (bench/fair_device.sh, the compiled peer with and
# without checkpointing), then rlbench with a timeline per model and
# bench/bound.py on it with the peers' results: what the train and ref
# stages are made of and how fast they could be at best.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/c2/rlbench .devbin/rlbench
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
python3 bench/gemm_peak.py --out "$OUT/peak.json" 2>&1 | tee -a "$OUT/summary.txt"
PEAK=$(python3 -c "import json;print(max(r['tflops'] for r in json.load(open('$OUT/peak.json'))['rows']))")
OUT="$OUT/fair" FAIR_MODELS="qwen2.5-1.5b qwen2.5-3b" FAIR_RUNS="auto peer-noac-compile peer-ac-compile" FAIR_BUDGET_S=360 \
	bash bench/fair_device.sh >"$OUT/fair.log" 2>&1
say "fair rc=$? at ${SECONDS}s"
grep -E 'best against best|rc=' "$OUT/fair.log" | tee -a "$OUT/summary.txt"
mkdir -p "$OUT/tl"
for m in qwen2.5-1.5b qwen2.5-3b; do
	timeout 120 .devbin/rlbench --backend cuda --config "examples/models/$m/config.json" --seqs 8 --tokens-per-seq 2048 \
		--prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q \
		--out "$OUT/tl/$m.json" --timeline "$OUT/tl/$m.trace.json" >"$OUT/tl/$m.log" 2>&1
	say "$m timeline rc=$? at ${SECONDS}s: $(tail -n 1 "$OUT/tl/$m.log" | cut -c1-240)"
	python3 bench/bound.py "$OUT/tl/$m.json" "$OUT/tl/$m.trace.json" "$OUT"/fair/peer-$m-*.json --peak-tflops "$PEAK" \
		>"$OUT/bound-$m.md" 2>&1
done
cat "$OUT"/bound-*.md | grep -A8 '^| bound' | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz fair tl fair.log && rm -rf fair tl fair.log)
