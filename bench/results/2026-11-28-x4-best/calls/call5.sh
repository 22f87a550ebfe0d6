#!/usr/bin/env bash
# Call 5 (four GPUs of one host): stages' TestSleepWakeCUDA, which failed in
# call 4 after the two- and four-GPU tests had run in the same process
# (NVML's process memory asleep above the plan's), alone with build 1
# (1b8220f) and build 2 (the tile queue), then after TestRunTinyCUDADP2 with
# each; then build 2's 1.5B timeline at dp 4 (rank 0) for the ref's per-op
# times, and one more alternated round of both builds at dp 4, 1.5B and 3B.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
export NCCL_NVLS_ENABLE=0
for bld in 1 2; do
	for run in 'TestSleepWakeCUDA$' 'TestRunTinyCUDADP2$|TestSleepWakeCUDA$'; do
		(cd stages && timeout 60 ../.devbin/$bld/stages.test -test.run "$run" -test.v) >"$OUT/sw-b$bld.log" 2>&1
		say "build $bld, -test.run '$run': rc=$? at ${SECONDS}s"
		grep -E '^(--- |ok|FAIL|PASS)|NVML shows|asleep: NVML' "$OUT/sw-b$bld.log" | head -8 | tee -a "$OUT/summary.txt"
		cat "$OUT/sw-b$bld.log" >>"$OUT/sleepwake.log"
	done
done
mkdir -p "$OUT/o"
M=qwen2.5-1.5b
W=(--backend cuda --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 3)
timeout 120 .devbin/2/rlbench --config examples/models/$M/config.json --seqs 32 --dp 4 "${W[@]}" --timeline "$OUT/o/tl-dp4-b2.trace.json" --out "$OUT/o/tl-dp4-b2.json" >"$OUT/o/tl.log" 2>&1
say "timeline dp 4, build 2: rc=$? $(tail -1 "$OUT/o/tl.log") at ${SECONDS}s"
python3 bench/trace_ops.py "$OUT/o/tl-dp4-b2.trace.json" --split-after "head log-prob chunks" >"$OUT/ops.txt" 2>&1
for M in qwen2.5-1.5b qwen2.5-3b; do
	for bld in 1 2; do
		n=$M-dp4-b$bld-r3
		((SECONDS < 500)) || { say "$n: skipped at ${SECONDS}s"; continue; }
		timeout 120 .devbin/$bld/rlbench --config examples/models/$M/config.json --seqs 32 --dp 4 "${W[@]}" --out "$OUT/o/$n.json" >"$OUT/o/$n.log" 2>&1
		say "$n: rc=$? $(tail -1 "$OUT/o/$n.log") at ${SECONDS}s"
	done
done
(cd "$OUT" && tar czf r.tgz o sleepwake.log && rm -rf o sw-b*.log)
