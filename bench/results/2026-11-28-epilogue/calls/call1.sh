#!/usr/bin/env bash
# Call 1 (one H200). Builds: b0 is main at fcf9323; n2 is b0 with the
# norm backward (rmsnorm_bwd8) in float32 arithmetic and one barrier a
# row; noepi, noload, nostore and nopf are n2 with diagnostic forms of
# k_gemm_dswiglu's epilogue (calls/dsvar.py: no epilogue work at all; g
# and u read from the staging tile instead of global memory; the stores
# skipped; no L2 prefetch).
# 1. gpu/cuda's norm tests on n2;
# 2. the norm backward's op benchmarks, b0 and n2 alternated twice;
# 3. BenchmarkDownSwiGLUBackward at the 3B and 1.5B shapes for every form;
# 4. the attention backward's passes (BenchmarkOps) on n2.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
(cd gpu/cuda && timeout 150 ../../.devbin/n2/cuda.test -test.run 'TestFusedNorms|TestRMSNorm|TestNormRowKernel|TestKernelNames' -test.v) >"$OUT/cuda-tests.log" 2>&1
say "gpu/cuda norm tests (n2): rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)' "$OUT/cuda-tests.log" | tee -a "$OUT/summary.txt"
mkdir -p "$OUT/ops"
for r in 1 2; do
	for b in b0 n2; do
		(cd gpu/cuda && timeout 60 ../../.devbin/$b/cuda.test -test.run '^$' -test.bench 'Ops/rmsnorm_bwd' -test.benchtime 50x) >"$OUT/ops/$b-$r.txt" 2>&1
		say "norm ops $b round $r: rc=$? at ${SECONDS}s"
		grep -E '^Benchmark' "$OUT/ops/$b-$r.txt" | tee -a "$OUT/summary.txt"
	done
done
for v in n2 noepi noload nostore nopf n2; do
	for shp in 16384,2048,11008 16384,1536,8960; do
		(cd gpu/cuda && RLPIPE_BENCH_DOWN=$shp timeout 60 ../../.devbin/$v/cuda.test -test.run '^$' -test.bench DownSwiGLUBackward -test.benchtime 20x) >"$OUT/ops/ds-$v-$shp.txt" 2>&1
		say "dswiglu $v $shp: rc=$? at ${SECONDS}s"
		grep -E '^Benchmark' "$OUT/ops/ds-$v-$shp.txt" | tee -a "$OUT/summary.txt"
	done
done
(cd gpu/cuda && timeout 90 ../../.devbin/n2/cuda.test -test.run '^$' -test.bench 'Ops/attention_(fwd|bwd)_8x2048_h12/2_d128' -test.benchtime 20x) >"$OUT/ops/attn.txt" 2>&1
say "attention ops: rc=$? at ${SECONDS}s"
grep -E '^Benchmark' "$OUT/ops/attn.txt" | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz ops cuda-tests.log 2>/dev/null; rm -rf ops)
