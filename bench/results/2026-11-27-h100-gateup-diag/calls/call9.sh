#!/usr/bin/env bash
# Call 9: D is branch gateup-diag at the commit named in the README
# (GS_DIAG bits 32: the epilogue warps poll the staged mbarrier with a
# 256 ns sleep between tries; 64: the consumers do not wait for the
# drained one, with 8 only). The fused row of BenchmarkGateUpSwiGLU (3B
# shapes) for GS_DIAG 0, 32, 8, 40, 72, 1, alternated, three rounds; then
# TestGateUpSwiGLU with 32.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
for rep in 1 2 3; do
	for g in 0 32 8 40 72 1; do
		(cd gpu/cuda && RLPIPE_DIAG_DEFINES="GS_DIAG=$g" timeout 100 ../../.devbin/D/cuda.test -test.run '^$' -test.bench 'GateUpSwiGLU/^fused' -test.benchtime 20x >"$R/bench-$g-$rep.log" 2>&1)
		say "[GS_DIAG=$g] rep $rep: $(grep -E '^Benchmark' "$R/bench-$g-$rep.log" | awk '{print $1, $3, $5}' | tr '\n' ';')"
	done
done
(cd gpu/cuda && RLPIPE_DIAG_DEFINES="GS_DIAG=32" timeout 150 ../../.devbin/D/cuda.test -test.run 'TestGateUpSwiGLU' >"$R/tests-32.log" 2>&1)
say "GS_DIAG=32 tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests-32.log" | tr '\n' ' ')"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
