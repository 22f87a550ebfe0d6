#!/usr/bin/env bash
# Call 7 (one H200): the down product's SwiGLU-backward kernel on tiles of
# 128 columns (RLPIPE_CUDA_DSWIGLU_FORM=128: seven epilogue warps; 128w: a
# fifth warpgroup, eleven, every warp at the launch's 96 registers)
# against main's 192: gpu/cuda's DownSwiGLU tests each way (the same bits
# as the unfused ops); BenchmarkDownSwiGLUBackward at the 1.5B and 3B
# shapes, alternated twice; rlbench 1.5B and 3B each way, alternated twice.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
B=.devbin/x8
for v in "" 128 128w; do
	(cd gpu/cuda && RLPIPE_CUDA_COMPILE_LOG=1 RLPIPE_CUDA_DSWIGLU_FORM=$v timeout 150 ../../$B/cuda.test -test.v -test.run 'TestDownSwiGLU' >"$OUT/r/tests-$v.log" 2>&1)
	say "tests form=$v rc=$? at ${SECONDS}s"
	grep -E '^(\s*--- |ok|PASS|FAIL)|panic|differ|fatal' "$OUT/r/tests-$v.log" | head -12 | tee -a "$OUT/summary.txt"
	grep -A4 -E "entry function '_?k_gemm_dswiglu" "$OUT/r/tests-$v.log" | grep -E 'entry|spill|Used' | head -24 | tee -a "$OUT/summary.txt"
done
for r in 1 2; do
	for shp in 16384,1536,8960 16384,2048,11008; do
		for v in "" 128 128w; do
			(cd gpu/cuda && RLPIPE_CUDA_DSWIGLU_FORM=$v RLPIPE_BENCH_DOWN=$shp timeout 100 ../../$B/cuda.test -test.run '^$' -test.bench 'DownSwiGLUBackward/(fused|product)' -test.benchtime 50x >"$OUT/r/bench-$v-$shp-$r.log" 2>&1)
			grep -E 'Benchmark' "$OUT/r/bench-$v-$shp-$r.log" | sed "s/^/f$v.$r /;s/BenchmarkDownSwiGLUBackward.//" | tee -a "$OUT/summary.txt"
		done
	done
done
one() { # NAME FORM MODEL
	RLPIPE_CUDA_DSWIGLU_FORM=$2 timeout 100 $B/rlbench --backend cuda --config "examples/models/$3/config.json" --seqs 8 --tokens-per-seq 2048 \
		--prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q \
		--out "$OUT/r/$1.json" >"$OUT/r/$1.log" 2>&1
	say "$1 rc=$? at ${SECONDS}s: $(tail -n 1 "$OUT/r/$1.log" | cut -c1-200)"
}
for r in 1 2; do
	for m in qwen2.5-1.5b qwen2.5-3b; do
		one $m-f192-$r "" $m
		one $m-f128-$r 128 $m
		one $m-f128w-$r 128w $m
	done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
