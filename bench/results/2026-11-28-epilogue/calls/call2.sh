#!/usr/bin/env bash
# Call 2 (one H200). Builds: b0 is main at fcf9323; new is b0 with the
# norm backward in float32 (call 1's n2) and k_gemm_dswiglu's g and u rows
# taken into shared memory in chunks (ring of 3 buffers); nnoepi is new
# with no epilogue work (calls/dsvar2.py); noepi is call 1's (the old
# kernel, ring of 4, no epilogue work).
# 1. gpu/cuda's tests of the changed kernels and of the products sharing
#    hopper.cuh's layout, on new;
# 2. BenchmarkDownSwiGLUBackward at the 3B and 1.5B shapes: b0, new,
#    nnoepi, noepi, new, b0;
# 3. rlbench 3B (two rounds, the first with timelines) and 1.5B (one
#    round), b0 and new alternated;
# 4. the stages package's CUDA tests on new, if time is left.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
(cd gpu/cuda && timeout 200 ../../.devbin/new/cuda.test -test.run 'TestDownSwiGLUBackward|TestFusedNorms|TestRMSNorm|TestGateUpSwiGLU|TestQKVRoPE|TestTileQueue|TestKernelNames|TestNormRowKernel' -test.v) >"$OUT/cuda-tests.log" 2>&1
say "gpu/cuda tests (new): rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)' "$OUT/cuda-tests.log" | tee -a "$OUT/summary.txt"
mkdir -p "$OUT/ops" "$OUT/rb"
i=0
for v in b0 new nnoepi noepi new b0; do
	i=$((i + 1))
	for shp in 16384,2048,11008 16384,1536,8960; do
		(cd gpu/cuda && RLPIPE_BENCH_DOWN=$shp timeout 60 ../../.devbin/$v/cuda.test -test.run '^$' -test.bench DownSwiGLUBackward -test.benchtime 20x) >"$OUT/ops/ds$i-$v-$shp.txt" 2>&1
		say "dswiglu $v $shp: rc=$? at ${SECONDS}s"
		grep -E '^Benchmark.*fused' "$OUT/ops/ds$i-$v-$shp.txt" | tee -a "$OUT/summary.txt"
	done
done
run() { # build model round [extra...]
	local b=$1 m=$2 r=$3
	shift 3
	timeout 100 .devbin/$b/rlbench --backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 3 --out "$OUT/rb/$m-$b-$r.json" "$@" >"$OUT/rb/$m-$b-$r.log" 2>&1
	say "$m $b round $r: rc=$? $(tail -1 "$OUT/rb/$m-$b-$r.log") at ${SECONDS}s"
}
run new qwen2.5-3b 1 --timeline "$OUT/rb/3b-new.trace.json"
run b0 qwen2.5-3b 1 --timeline "$OUT/rb/3b-b0.trace.json"
run new qwen2.5-3b 2
run b0 qwen2.5-3b 2
run new qwen2.5-1.5b 1
run b0 qwen2.5-1.5b 1
if ((SECONDS < 420)); then
	(cd stages && timeout $((560 - SECONDS)) ../.devbin/new/stages.test -test.run 'CUDA' -test.v) >"$OUT/stages-cuda.log" 2>&1
	say "stages CUDA tests (new): rc=$? at ${SECONDS}s"
	grep -E '^(--- |ok|FAIL|PASS)' "$OUT/stages-cuda.log" | tee -a "$OUT/summary.txt"
fi
(cd "$OUT" && tar czf r.tgz ops rb stages-cuda.log cuda-tests.log 2>/dev/null; rm -rf ops rb stages-cuda.log)
