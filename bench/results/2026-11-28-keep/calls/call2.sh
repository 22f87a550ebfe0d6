#!/usr/bin/env bash
# Call 2 (two GPUs): build 5 (the fused gate/up kernel with its products
# kept, on by default). The stages package's CUDA tests, the two-GPU ones
# included (then TestSleepWakeCUDA after them, with its corrected bound);
# then the 3B step's timeline at dp 1 with the kernel off and on
# (RLPIPE_CUDA_GEMM_SWIGLU_KEEP=0/1), alternated, twice; then
# overlap_reduce against base with recompute auto at dp 2, both models.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/5/rlbench .devbin/rlbench
cp .devbin/5/libnccl.test .devbin/libnccl.test
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
export NCCL_NVLS_ENABLE=0
(cd stages && timeout 150 ../.devbin/5/stages.test -test.run 'CUDA' -test.v) >"$OUT/stages-cuda.log" 2>&1
say "stages CUDA tests: rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|FAIL|PASS)|asleep: NVML' "$OUT/stages-cuda.log" | tee -a "$OUT/summary.txt"
mkdir -p "$OUT/tl"
M=qwen2.5-3b
for r in 1 2; do
	for k in 0 1; do
		RLPIPE_CUDA_GEMM_SWIGLU_KEEP=$k CUDA_VISIBLE_DEVICES=0 timeout 120 .devbin/rlbench --backend cuda --config examples/models/$M/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 3 --timeline "$OUT/tl/3b-keep$k-$r.trace.json" --out "$OUT/tl/3b-keep$k-$r.json" >"$OUT/tl/3b-keep$k-$r.log" 2>&1
		say "3B keep=$k round $r: rc=$? $(tail -1 "$OUT/tl/3b-keep$k-$r.log") at ${SECONDS}s"
	done
done
OUT=$OUT/ov OVERLAP_VARIANTS="base reduce" OVERLAP_FLAGS=--recompute-auto OVERLAP_BUDGET_S=$((570 - SECONDS)) bash bench/overlap_device.sh >"$OUT/overlap.log" 2>&1
say "overlap: rc=$? at ${SECONDS}s"
cat "$OUT/ov/summary.txt" >>"$OUT/summary.txt" 2>/dev/null
(cd "$OUT" && tar czf r.tgz stages-cuda.log tl ov overlap.log 2>/dev/null; rm -rf tl ov)
