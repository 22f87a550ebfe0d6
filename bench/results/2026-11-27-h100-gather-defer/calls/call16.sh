#!/usr/bin/env bash
# Call 16: M is main (e473022); W is M with the persistent products' ring
# buffers released by lane 0 of each consumer warp (8 arrivals a buffer
# instead of 256; branch warp-release). W's tests of the three kernels on
# the ring; their benchmarks' fused rows at 3B shapes, M and W alternated.
set -u
tar xzf .devbin/b.tgz -C .devbin
cd gpu/cuda
timeout 150 ../../.devbin/W/cuda.test -test.run 'TestGateUpSwiGLU|TestQKVRoPE|TestLogProbsFused' -test.v >/tmp/t.log 2>&1
echo "W tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' /tmp/t.log | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
for b in M W M W; do
	timeout 60 ../../.devbin/$b/cuda.test -test.run '^$' -test.bench 'GateUpSwiGLU/fused|QKVRoPE/fused' -test.benchtime 20x >/tmp/b.log 2>&1
	RLPIPE_BENCH_LP=2048,2048,151936 timeout 60 ../../.devbin/$b/cuda.test -test.run '^$' -test.bench 'LogProbsHead/fused' -test.benchtime 20x >>/tmp/b.log 2>&1
	echo "$b $(grep -E 'ns/op|FAIL' /tmp/b.log | awk '{print $1, $3}' | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
done
