#!/usr/bin/env bash
# Call 14: branch gateup-cluster + a diagnostic cap on the clustered
# kernel's grid (RLPIPE_CUDA_CLUSTER_GRID clusters) and the occupancy
# query's answer: BenchmarkGateUpSwiGLU's fused row at 3B shapes.
set -u
cd gpu/cuda
for g in 0 8 16 32 48 60; do
	RLPIPE_CUDA_CLUSTER_SAY=1 RLPIPE_CUDA_CLUSTER_GRID=$g timeout 60 ../../.devbin/cuda.test -test.run '^$' -test.bench 'GateUpSwiGLU/fused' -test.benchtime 10x >/tmp/b.log 2>&1
	echo "grid=$g $(grep -E 'ns/op|FAIL' /tmp/b.log | tail -1)" | tee -a "$OUT/summary.txt"
done
RLPIPE_CUDA_GEMM_CLUSTER=0 timeout 60 ../../.devbin/cuda.test -test.run '^$' -test.bench 'GateUpSwiGLU/fused' -test.benchtime 10x >/tmp/b.log 2>&1
echo "no clusters $(grep -E 'fused|FAIL' /tmp/b.log | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
