#!/usr/bin/env bash
# Call 3 (four GPUs of one host): why rlpipe's ref_logprob loses 12% per GPU
# from dp 1 to dp 4. Hypothesis: the persistent kernels (the fused gate/up
# SwiGLU, the fused q/k/v, the log-prob head), which take their tiles in a
# fixed order, one CTA an SM, wait on SMs that NCCL's all-gather kernels
# hold. 1.5B, rlbench recompute auto, with the three fused kernels on
# (default) and off (RLPIPE_CUDA_GEMM_SWIGLU=0 RLPIPE_CUDA_GEMM_QKV=0
# RLPIPE_CUDA_LP_FUSED=0: cuBLASLt and the unfused ops), at dp 1 and dp 4,
# two alternated rounds, each run's rank-0 timeline kept.
# Build 1 is main at 1b8220f.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/1/rlbench .devbin/rlbench
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
export NCCL_NVLS_ENABLE=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$OUT/o"
M=qwen2.5-1.5b
for round in 1 2; do
	for dp in 1 4; do
		for v in fused unfused; do
			env=()
			[[ $v == unfused ]] && env=(RLPIPE_CUDA_GEMM_SWIGLU=0 RLPIPE_CUDA_GEMM_QKV=0 RLPIPE_CUDA_LP_FUSED=0)
			n=$M-dp$dp-$v-r$round
			((SECONDS < 540)) || { say "$n: skipped at ${SECONDS}s"; continue; }
			tl=()
			((round == 1)) && tl=(--timeline "$OUT/o/$n.trace.json")
			env "${env[@]}" timeout 120 .devbin/rlbench --backend cuda --config examples/models/$M/config.json --seqs $((8 * dp)) --dp $dp \
				--tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc \
				--warmup 1 --steps 3 "${tl[@]}" --out "$OUT/o/$n.json" >"$OUT/o/$n.log" 2>&1
			say "$n: rc=$? $(tail -1 "$OUT/o/$n.log") at ${SECONDS}s"
		done
	done
done
for f in "$OUT"/o/*r1.trace.json; do
	echo "== $(basename "$f")"
	python3 bench/trace_ops.py "$f" --split-after "head log-prob chunks" 2>&1 | head -40
done >"$OUT/ops.txt"
(cd "$OUT" && tar czf r.tgz o && rm -rf o)
