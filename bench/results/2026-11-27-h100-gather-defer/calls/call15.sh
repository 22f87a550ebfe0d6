#!/usr/bin/env bash
# Call 15: branch gateup-cluster with the consumers' remote arrivals
# released at CTA scope (mbarrier.arrive.shared::cluster, no
# .release.cluster; stashed, not committed): TestGateUpSwiGLU, then
# BenchmarkGateUpSwiGLU at 3B shapes with clusters and without.
set -u
cd gpu/cuda
timeout 120 ../../.devbin/cuda.test -test.run 'TestGateUpSwiGLU' -test.v >/tmp/t.log 2>&1
echo "tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' /tmp/t.log | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
for c in 1 0 1 0; do
	RLPIPE_CUDA_GEMM_CLUSTER=$c timeout 60 ../../.devbin/cuda.test -test.run '^$' -test.bench 'GateUpSwiGLU/fused' -test.benchtime 20x >/tmp/b.log 2>&1
	echo "cluster=$c $(grep -E 'ns/op|FAIL' /tmp/b.log | tail -1)" | tee -a "$OUT/summary.txt"
done
