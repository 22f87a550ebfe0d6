#!/usr/bin/env bash
# Call 5 (H100): build 8 (build 7 with a fourth warpgroup for the dswiglu
# kernel's epilogue: seven epilogue warps instead of three). gpu/cuda's
# tests of the kernel and BenchmarkDownSwiGLUBackward at the 3B and 1.5B
# shapes; then, only if the fused kernel beat the unfused ops at 3B,
# rlbench's auto at 3B and 1.5B with the kernel on and off
# (RLPIPE_CUDA_DOWN_DSWIGLU=0), alternated, two rounds.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
(cd gpu/cuda && timeout 120 ../../.devbin/8/cuda.test -test.run 'TestDownSwiGLUBackward' -test.v) >"$OUT/cuda-tests.log" 2>&1
rc=$?
say "gpu/cuda tests: rc=$rc at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)|_test.go' "$OUT/cuda-tests.log" | head -20 | tee -a "$OUT/summary.txt"
for shape in 16384,2048,11008 16384,1536,8960; do
	(cd gpu/cuda && RLPIPE_BENCH_DOWN=$shape timeout 90 ../../.devbin/8/cuda.test -test.run '^$' -test.bench DownSwiGLUBackward -test.benchtime 20x) >>"$OUT/bench.log" 2>&1
done
grep -E 'Benchmark' "$OUT/bench.log" | tee -a "$OUT/summary.txt"
u=$(awk '/unfused_16384x11008/ {print $3}' "$OUT/bench.log")
f=$(awk '/fused_16384x11008/ && !/unfused/ {print $3}' "$OUT/bench.log")
say "3B shape: fused $f ns, unfused $u ns"
if ((rc == 0)) && [[ -n $u && -n $f ]] && ((f < u)); then
	mkdir -p "$OUT/r"
	W=(--backend cuda --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 3)
	for r in 1 2; do
		for m in qwen2.5-3b qwen2.5-1.5b; do
			for v in on off; do
				env=()
				[[ $v == off ]] && env=(RLPIPE_CUDA_DOWN_DSWIGLU=0)
				env "${env[@]}" timeout 150 .devbin/8/rlbench --config examples/models/$m/config.json "${W[@]}" --out "$OUT/r/$m-$v-$r.json" >"$OUT/r/$m-$v-$r.log" 2>&1
				say "$m $v round $r: rc=$? $(tail -1 "$OUT/r/$m-$v-$r.log") at ${SECONDS}s"
			done
		done
	done
fi
(cd "$OUT" && tar czf r.tgz r cuda-tests.log bench.log 2>/dev/null; rm -rf r bench.log)
