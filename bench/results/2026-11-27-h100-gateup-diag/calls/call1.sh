#!/usr/bin/env bash
# Call 1: E is main (603c0eb) + the review's shared exp2_approx (branch
# exp2-merge): its kernel compile for every architecture and the attention
# and log-prob tests. D is branch gateup-diag (3f7504a): the gate/up
# kernel with diagnostic bits (RLPIPE_DIAG_DEFINES=GS_DIAG=N: 1 no staging
# or epilogue, 2 no wgmma, 4 no TMA loads); BenchmarkGateUpSwiGLU's fused
# and products-only rows at 3B shapes for each, alternated twice.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee -a "$OUT/summary.txt"
(cd gpu/cuda && timeout 300 ../../.devbin/E/cuda.test -test.run 'TestKernelsCompile$' -test.v >"$R/compile.log" 2>&1)
say "E compile rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/compile.log" | tr '\n' ' ')"
(cd gpu/cuda && timeout 200 ../../.devbin/E/cuda.test -test.run 'TestAttention|TestLogProbs|TestHead' -test.v >"$R/tests.log" 2>&1)
say "E tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests.log" | tr '\n' ' ')"
for rep in 1 2; do
	for g in 0 1 2 4 5 3 6; do
		(cd gpu/cuda && RLPIPE_DIAG_DEFINES=GS_DIAG=$g timeout 100 ../../.devbin/D/cuda.test -test.run '^$' -test.bench 'GateUpSwiGLU/(fused|products)' -test.benchtime 20x >"$R/bench-$g-$rep.log" 2>&1)
		say "[GS_DIAG=$g] rep $rep: $(grep -E '^Benchmark' "$R/bench-$g-$rep.log" | awk '{$2=""; print}' | tr '\n' ';')"
	done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
