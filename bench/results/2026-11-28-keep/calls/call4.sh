#!/usr/bin/env bash
# Call 4 (H100): build 7 (build 6 with the dswiglu kernel's epilogue
# prefetching its tile's gate and up rows into L2 while the tensor cores
# run the tile's products). gpu/cuda's tests of the kernel and
# BenchmarkDownSwiGLUBackward at the 3B and 1.5B shapes; then rlbench's
# auto at 3B and 1.5B with the kernel on (build 7), off (build 7 with
# RLPIPE_CUDA_DOWN_DSWIGLU=0: the plan change alone) and build 0 (main at
# f4695d1), alternated, two rounds.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
(cd gpu/cuda && timeout 120 ../../.devbin/7/cuda.test -test.run 'TestDownSwiGLUBackward' -test.v) >"$OUT/cuda-tests.log" 2>&1
say "gpu/cuda tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)|_test.go' "$OUT/cuda-tests.log" | head -20 | tee -a "$OUT/summary.txt"
for shape in 16384,2048,11008 16384,1536,8960; do
	(cd gpu/cuda && RLPIPE_BENCH_DOWN=$shape timeout 90 ../../.devbin/7/cuda.test -test.run '^$' -test.bench DownSwiGLUBackward -test.benchtime 20x) >>"$OUT/bench.log" 2>&1
done
grep -E 'Benchmark' "$OUT/bench.log" | tee -a "$OUT/summary.txt"
mkdir -p "$OUT/r"
W=(--backend cuda --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 3)
for r in 1 2; do
	for m in qwen2.5-3b qwen2.5-1.5b; do
		for v in on off base; do
			bin=.devbin/7/rlbench env=()
			[[ $v == off ]] && env=(RLPIPE_CUDA_DOWN_DSWIGLU=0)
			[[ $v == base ]] && bin=.devbin/0/rlbench
			env "${env[@]}" timeout 150 "$bin" --config examples/models/$m/config.json "${W[@]}" --out "$OUT/r/$m-$v-$r.json" >"$OUT/r/$m-$v-$r.log" 2>&1
			say "$m $v round $r: rc=$? $(tail -1 "$OUT/r/$m-$v-$r.log") at ${SECONDS}s"
		done
	done
	((SECONDS > 420)) && break
done
(cd "$OUT" && tar czf r.tgz r cuda-tests.log bench.log 2>/dev/null; rm -rf r bench.log)
