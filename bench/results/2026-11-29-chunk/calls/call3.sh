#!/usr/bin/env bash
# Call 3 (one H200): energy a step. gpu/nvml's tests (TestEnergy reads the
# GPU's counter); bench/energy_probe.py beside an rlbench run (how often
# NVML's energy counter moves, and a read's time); then best against best
# at 1.5B and 3B (bench/fair_device.sh: rlpipe auto, the compiled peer
# with and without AC), both sides now reading the counter at each
# stage's syncs: the joules of each stage a step (compare.py's energy
# table in fair/best.md).
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/e3/rlbench .devbin/rlbench
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
(cd gpu/nvml && ../../.devbin/e3/nvml.test -test.v >"$OUT/r/nvml.log" 2>&1)
say "nvml tests rc=$?: $(grep -E '^--- ' "$OUT/r/nvml.log" | tr '\n' ' ')"
python3 bench/energy_probe.py 10 0 >"$OUT/r/probe.log" 2>&1 &
pr=$!
sleep 0.5
timeout 100 .devbin/rlbench --backend cuda --config examples/models/qwen2.5-1.5b/config.json --seqs 8 --tokens-per-seq 2048 \
	--prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q \
	--out "$OUT/r/probe-rlbench.json" >"$OUT/r/probe-rlbench.log" 2>&1
say "rlbench beside the probe rc=$?: $(tail -n 1 "$OUT/r/probe-rlbench.log" | cut -c1-400)"
wait $pr
say "probe: $(cat "$OUT/r/probe.log")"
OUT="$OUT/fair" FAIR_BUDGET_S=470 FAIR_MODELS="qwen2.5-1.5b qwen2.5-3b" FAIR_RUNS="auto peer-noac-compile peer-ac-compile" \
	bash bench/fair_device.sh >"$OUT/r/fair.log" 2>&1
say "fair rc=$? at ${SECONDS}s"
grep -E 'rc=|best against best' "$OUT/r/fair.log" | cut -c1-420 | tee -a "$OUT/summary.txt"
grep -A8 '^Energy a step' "$OUT/fair/best.md" | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz r fair && rm -rf r fair)
