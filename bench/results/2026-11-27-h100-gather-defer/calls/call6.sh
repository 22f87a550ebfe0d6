#!/usr/bin/env bash
# Call 6: build F (call 5's, RLPIPE_CUDA_QKV_SKIP a bit set, not kept: 1 no epilogue, 2
# the epilogue copies the staged values without bias, table or RoPE, 4
# the epilogue computes everything but stores nothing): BenchmarkQKVRoPE
# at the 3B shape with each.
set -u
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
cd gpu/cuda
for s in 16384,2048,16,2,128; do
	for skip in 0 1 2 4 6; do
		RLPIPE_CUDA_QKV_SKIP=$skip RLPIPE_BENCH_QKV=$s timeout 100 ../../.devbin/cuda.test -test.run '^$' -test.bench 'QKVRoPE/fused' -test.benchtime 30x >"$R/b.log" 2>&1
		say "skip=$skip $(grep -E 'Benchmark|FAIL' "$R/b.log")"
	done
done
