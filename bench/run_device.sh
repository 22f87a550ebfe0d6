#!/usr/bin/env bash
# The benchmark on one GPU, in one call: the PyTorch FSDP2 peer and rlpipe
# (.devbin/rlbench, built with `go build -o .devbin/rlbench
# ./bench/cmd/rlbench`) on Qwen2.5-0.5B and -1.5B shapes, without and with
# offload; JSON and logs to $OUT; the comparison table printed last.
#
#   OUT=/tmp/bench bash bench/run_device.sh
#
# Every run is guarded (timeout, its own log, failures recorded and skipped)
# and the whole script keeps to BENCH_BUDGET_S seconds (default 470): a run
# gets at most what is left, and is skipped when too little is.
# Knobs: PYTHON, RLBENCH, BENCH_BUDGET_S, BENCH_MODELS ("qwen2.5-0.5b qwen2.5-1.5b"),
# BENCH_SKIP_PEER=1, BENCH_SKIP_RLPIPE=1, BENCH_SKIP_OFFLOAD=1, BENCH_ONLY_OFFLOAD=1,
# BENCH_DP=N (N GPUs: the peer under torch.distributed.run, rlbench --dp N).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/logs"
PY=${PYTHON:-python3}
RLBENCH=${RLBENCH:-.devbin/rlbench}
BUDGET=${BENCH_BUDGET_S:-470}
MODELS=${BENCH_MODELS:-"qwen2.5-0.5b qwen2.5-1.5b"}
DP=${BENCH_DP:-1}
SUFFIX=""
PEER_LAUNCH=("$PY")
if ((DP > 1)); then
	SUFFIX="-dp$DP"
	PEER_LAUNCH=("$PY" -m torch.distributed.run --standalone --nproc_per_node "$DP")
fi
CACHE=${RLBENCH_CACHE:-/tmp/rlbench-cache}
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

say() { echo "[$(date -u +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$SUMMARY"; }

# guarded NAME LIMIT_S CMD...: runs CMD under timeout with what is left of the
# budget, logs to $OUT/logs/NAME.log, prints the command's last line.
guarded() {
	local name=$1 limit=$2
	shift 2
	local left=$((BUDGET - SECONDS - 10))
	if ((left < 25)); then
		say "$name: skipped, ${left}s of budget left"
		return 99
	fi
	((limit > left)) && limit=$left
	local t0=$SECONDS
	timeout -k 10 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
	local rc=$?
	local last
	last=$(grep -v '^\s*$' "$OUT/logs/$name.log" | tail -n 1)
	((rc == 124 || rc == 137)) && last="TIMED OUT after ${limit}s; $last"
	say "$name: rc=$rc in $((SECONDS - t0))s: ${last:0:400}"
	return $rc
}

say "start; OUT=$OUT budget=${BUDGET}s"
{
	nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.max.sm,power.limit,driver_version --format=csv 2>&1
	nvidia-smi 2>&1 | head -n 20
	nproc; free -g; uname -a
	"$PY" -c 'import sys, torch, transformers; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)' 2>&1
} >"$OUT/env.txt" 2>&1
head -n 2 "$OUT/env.txt" | tee -a "$SUMMARY"
grep -E '^torch ' "$OUT/env.txt" | tee -a "$SUMMARY"

[[ -z ${BENCH_SKIP_PEER:-} ]] && guarded peer-selftest 60 "$PY" bench/peer_fsdp2.py --selftest

have_rlbench=1
if [[ -z ${BENCH_SKIP_RLPIPE:-} ]]; then
	if [[ ! -x $RLBENCH ]]; then
		say "rlbench: $RLBENCH missing (build: go build -o .devbin/rlbench ./bench/cmd/rlbench); rlpipe runs skipped"
		have_rlbench=0
	else
		# A seconds-long end-to-end check of the CUDA backend on the tiny model.
		guarded rlbench-tiny 60 "$RLBENCH" --backend cuda --config examples/models/tiny-qwen2/config.json \
			--tokens-per-seq 256 --prompt-tokens 32 --chunk 256 --warmup 1 --steps 2 --cache "$CACHE" --out "$OUT/rlpipe-tiny.json"
	fi
fi

peer() { # peer MODEL OFFLOAD(0|1) LIMIT
	local m=$1 off=$2 limit=$3 name="peer-$1$SUFFIX" args=(--warmup 2 --steps 5)
	((off)) && name+="-offload" && args=(--offload --warmup 1 --steps 3)
	[[ -n ${BENCH_SKIP_PEER:-} ]] && return 0
	guarded "$name" "$limit" "${PEER_LAUNCH[@]}" bench/peer_fsdp2.py --config "examples/models/$m/config.json" \
		--seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 "${args[@]}" --out "$OUT/$name.json"
	local rc=$?
	# checkpoint_wrapper failing on this transformers version: retry with HF's own checkpointing.
	if ((rc != 0 && rc != 99 && rc != 124 && rc != 137)) && grep -qi checkpoint "$OUT/logs/$name.log" && ! grep -q OutOfMemory "$OUT/logs/$name.log"; then
		mv "$OUT/$name.json" "$OUT/failed-ac-wrapper-$name.json" 2>/dev/null
		guarded "$name-achf" "$limit" "${PEER_LAUNCH[@]}" bench/peer_fsdp2.py --config "examples/models/$m/config.json" \
			--seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 "${args[@]}" --ac hf --out "$OUT/$name.json"
	fi
}

rlpipe() { # rlpipe MODEL OFFLOAD(0|1) LIMIT
	local m=$1 off=$2 limit=$3 name="rlpipe-$1$SUFFIX" args=(--warmup 1 --steps 3 --budget-s 30 --dp "$DP")
	((off)) && name+="-offload" && args=(--offload --warmup 1 --steps 3 --budget-s 30 --dp "$DP")
	if [[ -n ${BENCH_SKIP_RLPIPE:-} ]] || ((have_rlbench == 0)); then
		return 0
	fi
	guarded "$name" "$limit" "$RLBENCH" --backend cuda --config "examples/models/$m/config.json" \
		--seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute "${args[@]}" \
		--cache "$CACHE" --out "$OUT/$name.json"
}

if [[ -z ${BENCH_ONLY_OFFLOAD:-} ]]; then
	for m in $MODELS; do
		peer "$m" 0 150
		rlpipe "$m" 0 150
	done
fi
if [[ -z ${BENCH_SKIP_OFFLOAD:-} ]]; then
	for m in $MODELS; do
		peer "$m" 1 120
		rlpipe "$m" 1 120
	done
fi

say "done"
"$PY" bench/compare.py "$OUT"/peer-*.json "$OUT"/rlpipe-qwen*.json >"$OUT/table.md" 2>>"$OUT/logs/compare.log"
echo
echo "=== summary ==="
cat "$SUMMARY"
echo
echo "=== comparison (also $OUT/table.md) ==="
cat "$OUT/table.md"
