#!/usr/bin/env bash
# Call 2: D is branch gateup-diag at 17e330b: the gate/up
# kernel's fused row of BenchmarkGateUpSwiGLU (3B shapes) under
# RLPIPE_DIAG_DEFINES "GS_DIAG=N GS_ST=S" (GS_DIAG bits: 1 no staging or
# epilogue, 2 no wgmma, 4 no TMA loads; GS_ST the ring's buffers), the
# configurations alternated, twice; cuBLASLt's two products once a round.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
for rep in 1 2; do
	(cd gpu/cuda && timeout 100 ../../.devbin/D/cuda.test -test.run '^$' -test.bench 'GateUpSwiGLU/^products' -test.benchtime 20x >"$R/bench-products-$rep.log" 2>&1)
	say "[products] rep $rep: $(grep -E '^Benchmark' "$R/bench-products-$rep.log" | awk '{$2=""; print}' | tr '\n' ';')"
	for c in 0,4 0,3 3,3 3,4 3,5 1,4 1,5 5,4 5,5; do
		g=${c%,*} s=${c#*,}
		(cd gpu/cuda && RLPIPE_DIAG_DEFINES="GS_DIAG=$g GS_ST=$s" timeout 100 ../../.devbin/D/cuda.test -test.run '^$' -test.bench 'GateUpSwiGLU/^fused' -test.benchtime 20x >"$R/bench-$g-$s-$rep.log" 2>&1)
		say "[GS_DIAG=$g GS_ST=$s] rep $rep: $(grep -E '^Benchmark' "$R/bench-$g-$s-$rep.log" | awk '{$2=""; print}' | tr '\n' ';')"
	done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
