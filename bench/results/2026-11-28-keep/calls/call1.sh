#!/usr/bin/env bash
# Call 1 (H100): build 4 (main at 4fd5973). The fused gate/up kernel that
# also keeps its products (RLPIPE_CUDA_GEMM_SWIGLU_KEEP=1), the tile
# queue's tq_slots form and TestSleepWakeCUDA's corrected bound, first run
# on a GPU: gpu/cuda's kernel tests, the model's HF parity with the keep
# switch on, the stages CUDA tests with it on; then rlpipe's auto with and
# without the switch at 3B and 1.5B, twice each, alternated, and the
# compiled peer once per model; a 3B timeline with the switch on.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/4/rlbench .devbin/rlbench
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
(cd gpu/cuda && timeout 150 ../../.devbin/4/cuda.test -test.run 'TestGateUpSwiGLU|TestQKVRoPE|TestLogProbsFused|TestTileQueue|TestKernelsCompile' -test.v) >"$OUT/cuda-tests.log" 2>&1
say "gpu/cuda tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)' "$OUT/cuda-tests.log" | tee -a "$OUT/summary.txt"
(cd model && RLPIPE_CUDA_GEMM_SWIGLU_KEEP=1 timeout 150 ../.devbin/4/model.test -test.run 'ParityHF|BF16|GateUp' -test.v) >"$OUT/model-tests.log" 2>&1
say "model tests (keep on): rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)|cuda' "$OUT/model-tests.log" | grep -vE '^=== ' | head -60 | tee -a "$OUT/summary.txt"
(cd stages && RLPIPE_CUDA_GEMM_SWIGLU_KEEP=1 timeout 150 ../.devbin/4/stages.test -test.run 'CUDA' -test.v) >"$OUT/stages-cuda.log" 2>&1
say "stages CUDA tests (keep on): rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|FAIL|PASS)|asleep: NVML' "$OUT/stages-cuda.log" | tee -a "$OUT/summary.txt"
for r in 1 2; do
	runs="auto auto-keep"
	[[ $r == 1 ]] && runs="auto auto-keep peer-ac-compile"
	OUT=$OUT/f3-$r FAIR_MODELS=qwen2.5-3b FAIR_RUNS="$runs" FAIR_BUDGET_S=200 bash bench/fair_device.sh >"$OUT/fair3-$r.log" 2>&1
	grep -E 'rc=|best against best|auto-keep|\| shared' "$OUT/fair3-$r.log" | tee -a "$OUT/summary.txt"
	say "at ${SECONDS}s"
	runs="auto auto-keep"
	[[ $r == 1 ]] && runs="auto auto-keep peer-noac-compile"
	OUT=$OUT/f15-$r FAIR_MODELS=qwen2.5-1.5b FAIR_RUNS="$runs" FAIR_BUDGET_S=150 bash bench/fair_device.sh >"$OUT/fair15-$r.log" 2>&1
	grep -E 'rc=|best against best|auto-keep|\| shared' "$OUT/fair15-$r.log" | tee -a "$OUT/summary.txt"
	say "at ${SECONDS}s"
done
rm -rf "$OUT"/f*/work-*
if ((SECONDS < 500)); then
	M=qwen2.5-3b
	RLPIPE_CUDA_GEMM_SWIGLU_KEEP=1 timeout $((585 - SECONDS)) .devbin/rlbench --backend cuda --config examples/models/$M/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 2 --timeline "$OUT/3b-keep.trace.json" --out "$OUT/tl-3b-keep.json" >"$OUT/tl.log" 2>&1
	say "timeline (keep on): rc=$? $(tail -1 "$OUT/tl.log") at ${SECONDS}s"
fi
(cd "$OUT" && tar czf r.tgz f3-* f15-* fair*.log cuda-tests.log model-tests.log stages-cuda.log tl.log tl-3b-keep.json 3b-keep.trace.json 2>/dev/null; rm -rf f3-* f15-* fair*.log *.trace.json)
