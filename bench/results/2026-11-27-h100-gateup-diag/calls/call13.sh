#!/usr/bin/env bash
# Call 13 (the review's check): F is main at a23fc27 with the gate/up and
# q/k/v kernels' consumer loop shared as hopper.cuh's wg_consume; M2 is
# a23fc27. F's kernel compile for every architecture and both kernels'
# tests; the fused rows of both benchmarks, M2 and F alternated, twice.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && timeout 300 ../../.devbin/F/cuda.test -test.run 'TestKernelsCompile$|TestGateUpSwiGLU|TestQKVRoPE' -test.v >"$R/tests.log" 2>&1)
say "F tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests.log" | tr '\n' ' ')"
for rep in 1 2; do
	for b in M2 F; do
		(cd gpu/cuda && timeout 100 ../../.devbin/$b/cuda.test -test.run '^$' -test.bench '(GateUpSwiGLU|QKVRoPE)/^fused' -test.benchtime 20x >"$R/bench-$b-$rep.log" 2>&1)
		say "[$b] rep $rep: $(grep -E '^Benchmark' "$R/bench-$b-$rep.log" | awk '{print $1, $3, $5}' | tr '\n' ';')"
	done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
