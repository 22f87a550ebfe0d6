#!/usr/bin/env bash
# Call 3: D is branch gateup-diag at 71c014a: the gate/up kernel's fused
# row of BenchmarkGateUpSwiGLU (3B shapes) under RLPIPE_DIAG_DEFINES
# GS_DIAG=N (0 as main; 8 the epilogue warps only wait for the staged tile
# and release it; 16 they do the SwiGLU but store nothing; 1 no staging
# and no epilogue), alternated, three rounds; then ptxas's report of the
# gemm module for sm_90a.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
for rep in 1 2 3; do
	for g in 0 8 16 1; do
		(cd gpu/cuda && RLPIPE_DIAG_DEFINES="GS_DIAG=$g" timeout 100 ../../.devbin/D/cuda.test -test.run '^$' -test.bench 'GateUpSwiGLU/^fused' -test.benchtime 20x >"$R/bench-$g-$rep.log" 2>&1)
		say "[GS_DIAG=$g] rep $rep: $(grep -E '^Benchmark' "$R/bench-$g-$rep.log" | awk '{$2=""; print}' | tr '\n' ';')"
	done
done
(cd gpu/cuda && RLPIPE_CACHE_DIR=/tmp/kc-log RLPIPE_COMPILE_ARCHS=sm_90a RLPIPE_CUDA_COMPILE_LOG=1 timeout 200 ../../.devbin/D/cuda.test -test.run 'TestKernelsCompile$' -test.v >"$R/compile.log" 2>&1)
say "compile rc=$?"
grep -A3 -E "k_gemm_swiglu_bf16" "$R/compile.log" | head -20 | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
