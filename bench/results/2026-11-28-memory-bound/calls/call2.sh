#!/usr/bin/env bash
# Call 2 (one H200): build 12 (build 11 + AdamW of 16-bit grads
# (k_adamw4_16), and on one rank the layers' grads left where the backward
# accumulated them for the grad norm and AdamW to read: no fp32 copy,
# RLPIPE_RAW_GRADS=0 puts it back). gpu/cuda's tests of the changed
# kernels, the stages CUDA tests, the op benchmarks once (with the norm
# backward's "dx apart" row), then rlbench's 3B and 1.5B steps with the
# switch on and off, alternated, the first pair with timelines.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
(cd gpu/cuda && timeout 120 ../../.devbin/12/cuda.test -test.run 'TestFusedNorms|TestAdamWAndSumSquares|TestRMSNorm|TestVectorKernels|TestKernelNames' -test.v) >"$OUT/cuda-tests.log" 2>&1
say "gpu/cuda tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)|cuda_test.go' "$OUT/cuda-tests.log" | tee -a "$OUT/summary.txt"
(cd stages && timeout 150 ../.devbin/12/stages.test -test.run 'CUDA' -test.v) >"$OUT/stages-cuda.log" 2>&1
say "stages CUDA tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|FAIL|PASS)' "$OUT/stages-cuda.log" | tee -a "$OUT/summary.txt"
mkdir -p "$OUT/ops" "$OUT/rb"
(cd gpu/cuda && timeout 60 ../../.devbin/12/cuda.test -test.run '^$' -test.bench 'Ops/(rmsnorm_bwd|adamw|sumsquares)' -test.benchtime 50x) >"$OUT/ops/b12.txt" 2>&1
say "ops build 12: rc=$? at ${SECONDS}s"
grep -E '^Benchmark' "$OUT/ops/b12.txt" | tee -a "$OUT/summary.txt"
run() { # raw model round [extra...]
	local k=$1 m=$2 r=$3
	shift 3
	RLPIPE_RAW_GRADS=$k timeout 100 .devbin/12/rlbench --backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 3 --out "$OUT/rb/$m-raw$k-$r.json" "$@" >"$OUT/rb/$m-raw$k-$r.log" 2>&1
	say "$m raw=$k round $r: rc=$? $(tail -1 "$OUT/rb/$m-raw$k-$r.log") at ${SECONDS}s"
}
run 1 qwen2.5-3b 1 --timeline "$OUT/rb/3b-raw1.trace.json"
run 0 qwen2.5-3b 1 --timeline "$OUT/rb/3b-raw0.trace.json"
run 1 qwen2.5-3b 2
run 0 qwen2.5-3b 2
for r in 1 2; do
	run 1 qwen2.5-1.5b $r
	run 0 qwen2.5-1.5b $r
done
grep -h 'plan:' "$OUT"/rb/*raw1-1.log "$OUT"/rb/*raw0-1.log | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz ops rb stages-cuda.log 2>/dev/null; rm -rf ops rb stages-cuda.log)
