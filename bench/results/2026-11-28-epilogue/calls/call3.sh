#!/usr/bin/env bash
# Call 3 (one H200). Builds: b0 is main at fcf9323; A is b0 with the norm
# backward in float32 (call 1's n2) and k_gemm_dswiglu's g and u rows
# copied into shared memory by the TMA, one box of g and one of u a chunk
# (DS_ST 3 ring buffers, DS_CR 16 rows a chunk, DS_NB 4 chunk buffers);
# B, C and D are A with (DS_ST, DS_CR, DS_NB) = (4, 8, 2), (4, 16, 1) and
# (3, 8, 8).
# 1. gpu/cuda's tests of the changed kernels and of the products whose
#    tensor maps' key changed, on A; TestDownSwiGLUBackward on B, C, D;
# 2. BenchmarkDownSwiGLUBackward at the 3B and 1.5B shapes: b0 A B C D A b0;
# 3. rlbench 3B (two rounds, the first with timelines) and 1.5B (two
#    rounds), b0 and A alternated;
# 4. the stages package's CUDA tests on A, if time is left.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
(cd gpu/cuda && timeout 200 ../../.devbin/A/cuda.test -test.run 'TestDownSwiGLUBackward|TestFusedNorms|TestRMSNorm|TestGateUpSwiGLU|TestQKVRoPE|TestTileQueue|TestLogProbsFused|TestAttentionTensorCore|TestAttentionSpans|TestKernelNames' -test.v) >"$OUT/cuda-tests.log" 2>&1
say "gpu/cuda tests (A): rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)' "$OUT/cuda-tests.log" | tee -a "$OUT/summary.txt"
for v in B C D; do
	(cd gpu/cuda && timeout 60 ../../.devbin/$v/cuda.test -test.run 'TestDownSwiGLUBackward' -test.v) >"$OUT/cuda-tests-$v.log" 2>&1
	say "TestDownSwiGLUBackward ($v): rc=$? at ${SECONDS}s"
	grep -E '^(--- |FAIL|ok|PASS)' "$OUT/cuda-tests-$v.log" | tee -a "$OUT/summary.txt"
done
mkdir -p "$OUT/ops" "$OUT/rb"
i=0
for v in b0 A B C D A b0; do
	i=$((i + 1))
	for shp in 16384,2048,11008 16384,1536,8960; do
		(cd gpu/cuda && RLPIPE_BENCH_DOWN=$shp timeout 60 ../../.devbin/$v/cuda.test -test.run '^$' -test.bench DownSwiGLUBackward -test.benchtime 20x) >"$OUT/ops/ds$i-$v-$shp.txt" 2>&1
		say "dswiglu $v $shp: rc=$? at ${SECONDS}s"
		grep -E '^Benchmark.*(fused|product)' "$OUT/ops/ds$i-$v-$shp.txt" | tee -a "$OUT/summary.txt"
	done
done
run() { # build model round [extra...]
	local b=$1 m=$2 r=$3
	shift 3
	timeout 100 .devbin/$b/rlbench --backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 3 --out "$OUT/rb/$m-$b-$r.json" "$@" >"$OUT/rb/$m-$b-$r.log" 2>&1
	say "$m $b round $r: rc=$? $(tail -1 "$OUT/rb/$m-$b-$r.log") at ${SECONDS}s"
}
run A qwen2.5-3b 1 --timeline "$OUT/rb/3b-A.trace.json"
run b0 qwen2.5-3b 1 --timeline "$OUT/rb/3b-b0.trace.json"
run A qwen2.5-3b 2
run b0 qwen2.5-3b 2
run A qwen2.5-1.5b 1
run b0 qwen2.5-1.5b 1
run A qwen2.5-1.5b 2
run b0 qwen2.5-1.5b 2
if ((SECONDS < 430)); then
	(cd stages && timeout $((560 - SECONDS)) ../.devbin/A/stages.test -test.run 'CUDA' -test.v) >"$OUT/stages-cuda.log" 2>&1
	say "stages CUDA tests (A): rc=$? at ${SECONDS}s"
	grep -E '^(--- |ok|FAIL|PASS)' "$OUT/stages-cuda.log" | tee -a "$OUT/summary.txt"
fi
(cd "$OUT" && tar czf r.tgz ops rb stages-cuda.log cuda-tests*.log 2>/dev/null; rm -rf ops rb stages-cuda.log cuda-tests-*.log)
