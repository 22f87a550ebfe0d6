#!/usr/bin/env bash
# Call 2 (four GPUs of one host), build w: is the dp-4 loss per GPU the
# communication's, or the machine's with four GPUs busy? rlbench's
# benchmark step at dp 1 on GPU 0 alone, then four dp 1 processes at once
# (one per GPU, nothing shared), then dp 4 (one process, NCCL), each
# twice, 3B then 1.5B (recompute auto, 8 x 2048 tokens a GPU, 6 timed
# steps). nvidia-smi logs every GPU's SM clock, power and temperature
# every 200 ms meanwhile.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/rb"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 200 >"$OUT/rb/smi.csv" 2>&1 &
SMI=$!
rb() { # NAME MODEL DP DEVICE
	local n=$1 m=$2 dp=$3 dev=$4
	echo "$(date +%s.%N) start $n" >>"$OUT/rb/marks.txt"
	timeout 200 .devbin/w/rlbench --backend cuda --config "examples/models/$m/config.json" --dp $dp --device $dev --seqs $((8 * dp)) \
		--tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 6 --precision bf16 --recompute-auto \
		--cache /tmp/rbc --out "$OUT/rb/$n.json" >"$OUT/rb/$n.log" 2>&1
	local rc=$?
	echo "$(date +%s.%N) end $n" >>"$OUT/rb/marks.txt"
	say "$n rc=$rc at ${SECONDS}s: $(tail -n 1 "$OUT/rb/$n.log" | cut -c1-200)"
}
for m in qwen2.5-3b qwen2.5-1.5b; do
	for r in 1 2; do
		((SECONDS < 470)) || break
		rb "$m-alone-$r" $m 1 0
		pids=()
		for d in 0 1 2 3; do
			rb "$m-four-$r-gpu$d" $m 1 $d &
			pids+=($!)
		done
		wait "${pids[@]}"
		rb "$m-dp4-$r" $m 4 0
	done
done
kill $SMI
(cd "$OUT" && tar czf r.tgz rb && rm -rf rb)
