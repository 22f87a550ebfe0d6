#!/usr/bin/env bash
# Call 3 (one H200), build s3 (main at 879912f with the consumers' share
# of k_gemm_dswiglu's epilogue: kernels k_gemm_dswiglu_sN_*, N of each
# row's 24 vectors of 8 outputs computed by the consumer warps after they
# stage a tile, picked by RLPIPE_CUDA_DSWIGLU_VS=N; unset: N = 4).
# TestDownSwiGLUBackward and TestDownSwiGLUBackwardBits (bit for bit
# against the unfused ops) for each N; BenchmarkDownSwiGLUBackward at the
# 1.5B and 3B shapes for N = 0 (main's kernel), 2, 4, 6, 8, alternated
# twice; rlbench's step at 1.5B and 3B with N = 0 and 4, alternated.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
B=.devbin/s3
for v in 0 2 4 6 8; do
	(cd gpu/cuda && RLPIPE_CUDA_DSWIGLU_VS=$v timeout 60 ../../$B/cuda.test -test.v -test.run 'TestDownSwiGLUBackward' >"$OUT/r/tests-$v.log" 2>&1)
	say "tests N=$v rc=$?: $(grep -E '^(--- |ok|FAIL)' "$OUT/r/tests-$v.log" | tr '\n' ' ')"
done
for shp in 16384,1536,8960 16384,2048,11008; do
	for r in 1 2; do
		for v in 0 2 4 6 8; do
			(cd gpu/cuda && RLPIPE_CUDA_DSWIGLU_VS=$v RLPIPE_BENCH_DOWN=$shp timeout 60 ../../$B/cuda.test -test.run '^$' -test.bench 'DownSwiGLUBackward/(fused|product)' -test.benchtime 50x >"$OUT/r/b-$shp-$v-$r.log" 2>&1)
			say "$(grep -E 'Benchmark' "$OUT/r/b-$shp-$v-$r.log" | sed "s/^/N$v.$r /" | awk '{print $1, $2, $4, $6}' | tr '\n' ' ')"
		done
	done
done
one() { # NAME N MODEL
	RLPIPE_CUDA_DSWIGLU_VS=$2 timeout 120 $B/rlbench --backend cuda --config "examples/models/$3/config.json" --seqs 8 --tokens-per-seq 2048 \
		--prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q \
		--out "$OUT/r/$1.json" >"$OUT/r/$1.log" 2>&1
	say "$1 rc=$? at ${SECONDS}s: $(tail -n 1 "$OUT/r/$1.log" | cut -c1-200)"
}
for r in 1 2; do
	for m in qwen2.5-1.5b qwen2.5-3b; do
		((SECONDS < 400)) || break
		one $m-n0-$r 0 $m
		one $m-n4-$r 4 $m
	done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
