#!/usr/bin/env bash
# Call 4 (four GPUs of one host): the persistent products' tile queue
# (build 2: their CTAs take tiles from a counter as they get to them)
# against build 1 (1b8220f: a fixed share each). First gpu/cuda's tests of
# the three persistent kernels, the tile queue and attention (the stream
# scratch's new end), then the stages package's CUDA tests (one to four
# GPUs), then rlbench at 1.5B and 3B, dp 1 and dp 4, the two builds
# alternated.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
export NCCL_NVLS_ENABLE=0
(cd gpu/cuda && timeout 200 ../../.devbin/2/cuda.test -test.run 'TestGateUpSwiGLU|TestQKVRoPE|TestLogProbsFused|TestTileQueue|TestAttention|TestStreams' -test.v) >"$OUT/cuda-tests.log" 2>&1
say "gpu/cuda tests: rc=$? at ${SECONDS}s"
grep -E '^(--- FAIL|FAIL|ok|PASS)|not the same|TestTileQueue' "$OUT/cuda-tests.log" | head -30 | tee -a "$OUT/summary.txt"
(cd stages && timeout 150 ../.devbin/2/stages.test -test.run 'CUDA' -test.v) >"$OUT/stages-cuda.log" 2>&1
say "stages CUDA tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|FAIL|PASS)' "$OUT/stages-cuda.log" | tee -a "$OUT/summary.txt"
mkdir -p "$OUT/o"
for M in qwen2.5-1.5b qwen2.5-3b; do
	rounds="1 2"
	[[ $M == qwen2.5-3b ]] && rounds=1
	for round in $rounds; do
		for dp in 1 4; do
			for bld in 1 2; do
				n=$M-dp$dp-b$bld-r$round
				((SECONDS < 560)) || { say "$n: skipped at ${SECONDS}s"; continue; }
				timeout 120 .devbin/$bld/rlbench --backend cuda --config examples/models/$M/config.json --seqs $((8 * dp)) --dp $dp \
					--tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc \
					--warmup 1 --steps 3 --out "$OUT/o/$n.json" >"$OUT/o/$n.log" 2>&1
				say "$n: rc=$? $(tail -1 "$OUT/o/$n.log") at ${SECONDS}s"
			done
		done
	done
done
(cd "$OUT" && tar czf r.tgz o cuda-tests.log stages-cuda.log && rm -rf o)
