#!/usr/bin/env bash
# Call 3 (H100): build 6 (the down projection's input gradient with
# SwiGLU's backward in one kernel, k_gemm_dswiglu_*, and the plan without
# a dact buffer) first run on a GPU. gpu/cuda's tests of the new kernel
# and of the gate/up one, then BenchmarkDownSwiGLUBackward at the 3B and
# 1.5B shapes; model's HF parity on CUDA; the stages CUDA tests. Then
# rlbench's auto at 3B and 1.5B against build 0 (main at f4695d1, before
# the change) as FAIR_BASE, with the compiled peer, and a second round of
# both builds. If the kernel's tests fail, the rlbench runs go with
# RLPIPE_CUDA_DOWN_DSWIGLU=0 (the plan change alone).
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/6/rlbench .devbin/rlbench
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
(cd gpu/cuda && timeout 150 ../../.devbin/6/cuda.test -test.run 'TestDownSwiGLUBackward|TestGateUpSwiGLU|TestTileQueue' -test.v) >"$OUT/cuda-tests.log" 2>&1
rc=$?
say "gpu/cuda tests: rc=$rc at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)|_test.go' "$OUT/cuda-tests.log" | head -40 | tee -a "$OUT/summary.txt"
if ((rc != 0)); then
	export RLPIPE_CUDA_DOWN_DSWIGLU=0
	say "kernel tests failed: the rest with RLPIPE_CUDA_DOWN_DSWIGLU=0"
fi
for shape in 16384,2048,11008 16384,1536,8960; do
	(cd gpu/cuda && RLPIPE_BENCH_DOWN=$shape timeout 90 ../../.devbin/6/cuda.test -test.run '^$' -test.bench DownSwiGLUBackward -test.benchtime 20x) >>"$OUT/bench.log" 2>&1
	say "bench $shape: rc=$?"
done
grep -E 'Benchmark' "$OUT/bench.log" | tee -a "$OUT/summary.txt"
(cd model && timeout 120 ../.devbin/6/model.test -test.run 'ParityHF|BF16|DownSwiGLU' -test.v) >"$OUT/model-tests.log" 2>&1
say "model tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)' "$OUT/model-tests.log" | head -30 | tee -a "$OUT/summary.txt"
(cd stages && timeout 150 ../.devbin/6/stages.test -test.run 'CUDA' -test.v) >"$OUT/stages-cuda.log" 2>&1
say "stages CUDA tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|FAIL|PASS)' "$OUT/stages-cuda.log" | tee -a "$OUT/summary.txt"
for r in 1 2; do
	runs="auto"
	[[ $r == 1 ]] && runs="auto peer-ac-compile"
	OUT=$OUT/f3-$r FAIR_MODELS=qwen2.5-3b FAIR_RUNS="$runs" FAIR_BASE=.devbin/0/rlbench FAIR_BUDGET_S=200 bash bench/fair_device.sh >"$OUT/fair3-$r.log" 2>&1
	grep -E 'rc=|best against best|base auto|\| shared' "$OUT/fair3-$r.log" | tee -a "$OUT/summary.txt"
	say "at ${SECONDS}s"
	runs="auto"
	[[ $r == 1 ]] && runs="auto peer-noac-compile"
	OUT=$OUT/f15-$r FAIR_MODELS=qwen2.5-1.5b FAIR_RUNS="$runs" FAIR_BASE=.devbin/0/rlbench FAIR_BUDGET_S=150 bash bench/fair_device.sh >"$OUT/fair15-$r.log" 2>&1
	grep -E 'rc=|best against best|base auto|\| shared' "$OUT/fair15-$r.log" | tee -a "$OUT/summary.txt"
	say "at ${SECONDS}s"
	((SECONDS > 450)) && break
done
rm -rf "$OUT"/f*/work-*
if ((SECONDS < 500)); then
	M=qwen2.5-3b
	timeout $((585 - SECONDS)) .devbin/rlbench --backend cuda --config examples/models/$M/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 2 --timeline "$OUT/3b.trace.json" --out "$OUT/tl-3b.json" >"$OUT/tl.log" 2>&1
	say "timeline: rc=$? $(tail -1 "$OUT/tl.log") at ${SECONDS}s"
fi
(cd "$OUT" && tar czf r.tgz f3-* f15-* fair*.log cuda-tests.log bench.log model-tests.log stages-cuda.log tl.log tl-3b.json 3b.trace.json 2>/dev/null; rm -rf f3-* f15-* fair*.log *.trace.json bench.log model-tests.log)
