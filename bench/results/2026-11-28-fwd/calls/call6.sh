#!/usr/bin/env bash
# Call 6 (four GPUs of one host): NCCL's CTAs at dp 4 with build n
# (overlap_reduce auto, on: gathers and reductions both on the side
# stream). rlbench's benchmark step (recompute auto, 8 x 2048 tokens a GPU)
# with NCCL's defaults and with NCCL_MIN_CTAS = NCCL_MAX_CTAS = 4, 8 and
# 16, alternated over two rounds, 3B and 1.5B; first one run with
# NCCL_DEBUG=INFO for the channels NCCL sets up by default.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/rb"
one() { # NAME MODEL [ENV=...]
	local n=$1 m=$2
	shift 2
	timeout 200 env "$@" .devbin/n/rlbench --backend cuda --config "examples/models/$m/config.json" --dp 4 --seqs 32 \
		--tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto \
		--cache /tmp/rbc -q --out "$OUT/rb/$n.json" >"$OUT/rb/$n.log" 2>&1
	say "$n rc=$? at ${SECONDS}s: $(tail -n 1 "$OUT/rb/$n.log" | cut -c1-200)"
}
one debug qwen2.5-1.5b NCCL_DEBUG=INFO
grep -E 'Channel [0-9]+/[0-9]+|nChannels|CTAs|Connected all' "$OUT/rb/debug.log" | sed 's/^.*NCCL INFO //' | sort | uniq -c | sort -rn | head -12 | tee -a "$OUT/summary.txt"
for r in 1 2; do
	for m in qwen2.5-3b qwen2.5-1.5b; do
		((SECONDS < 470)) || break
		one "$m-default-$r" $m X=1
		for k in 4 8 16; do
			one "$m-ctas$k-$r" $m NCCL_MIN_CTAS=$k NCCL_MAX_CTAS=$k
		done
	done
done
(cd "$OUT" && tar czf r.tgz rb && rm -rf rb)
