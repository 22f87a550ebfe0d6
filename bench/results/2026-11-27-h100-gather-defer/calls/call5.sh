#!/usr/bin/env bash
# Call 5: build E (call 3's QKVRoPE with the epilogue taking two items at a
# time, its bias and table loads through the read-only path, and a switch,
# not kept, RLPIPE_CUDA_QKV_SKIP=1, that skips the epilogue's work): the
# kernel's tests, then BenchmarkQKVRoPE at the 3B and 0.5B shapes with the
# epilogue and without (the product's floor).
set -u
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
cd gpu/cuda
timeout 200 ../../.devbin/cuda.test -test.run 'TestQKVRoPE' -test.v >"$R/cuda-tests.log" 2>&1
say "cuda tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/cuda-tests.log" | tr '\n' ' ')"
for s in 16384,2048,16,2,128 16384,896,14,2,64; do
	for skip in 0 1 0; do
		RLPIPE_CUDA_QKV_SKIP=$skip RLPIPE_BENCH_QKV=$s timeout 100 ../../.devbin/cuda.test -test.run '^$' -test.bench 'QKVRoPE/fused' -test.benchtime 30x >"$R/b.log" 2>&1
		say "skip=$skip $(grep -E 'Benchmark|FAIL' "$R/b.log")"
	done
done
