#!/usr/bin/env bash
# The warp-specialised attention forward (k_ws_fwd_*, TMA loads, issue
# 11's Hopper attention) against the wgmma forward it replaced, in one
# device call on a Hopper GPU:
#
#   1. gpu/cuda's kernel compile and attention tests, with ptxas's report
#      of every kernel's registers and spills (RLPIPE_CUDA_COMPILE_LOG=1,
#      a fresh kernel cache) in cuda-tests.log; TestAttentionTensorCore
#      runs the forward on the wgmma kernel and on the warp-specialised
#      one with and without its consumers' turns;
#   2. BenchmarkOps' attention forward rows (8 × 2048 tokens at head dims
#      128 and 64, and 2 × 16384 at 128) on each kernel;
#   3. rlbench's step for each of ATTN_MODELS (8 × 2048 tokens, recompute
#      auto, as bench/fair_device.sh runs it), alternated over ATTN_ROUNDS
#      rounds: wg (RLPIPE_CUDA_FWD_WS=0), wsnopp (RLPIPE_CUDA_FWD_PINGPONG=0)
#      and ws (the defaults).
#
# Build first:
#
#   L='-ldflags=-s -w'
#   go test -c "$L" -o .devbin/cuda.test ./gpu/cuda
#   go build "$L" -o .devbin/rlbench ./bench/cmd/rlbench
#
# Knobs: ATTN_MODELS ("qwen2.5-1.5b qwen2.5-3b"; empty: no step runs),
# ATTN_ROUNDS (2),
# ATTN_BUDGET_S (560).
# $OUT gets summary.txt and attn.tgz (the logs and JSON).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/attn-out}
MODELS=${ATTN_MODELS-"qwen2.5-1.5b qwen2.5-3b"}
ROUNDS=${ATTN_ROUNDS:-2}
BUDGET=${ATTN_BUDGET_S:-560}
. bench/device_lib.sh # outdirs, say, budgeted, split_env
outdirs attn
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/attn/env.txt" 2>&1
say "start: $(tail -n +2 "$OUT/attn/env.txt" | head -n 1); budget ${BUDGET}s"

export RLPIPE_CACHE_DIR=/tmp/rlpipe-attn-cache
rm -rf "$RLPIPE_CACHE_DIR"
say "$(cd gpu/cuda && budgeted cuda-tests 240 env RLPIPE_CUDA_COMPILE_LOG=1 "$B/cuda.test" -test.v -test.timeout 230s \
	-test.run 'TestKernelsCompile|TestAttentionTensorCore|TestTensorCore|TestAttentionSpans')"
grep -E '^(--- |ok|PASS|FAIL)' "$OUT/logs/cuda-tests.log" | head -n 40 | tee -a "$OUT/summary.txt"
grep -E -A3 "k_ws_fwd_bf16_128' for 'sm_90a|k_wg_fwd_bf16_128' for 'sm_90a" "$OUT/logs/cuda-tests.log" |
	grep -E 'registers|spill|Compiling' | head -n 8 | tee -a "$OUT/summary.txt"
grep -i 'wgmma' "$OUT/logs/cuda-tests.log" | grep -iv '^\s*$' | head -n 10 | tee -a "$OUT/summary.txt"
say "$(cd gpu/cuda && budgeted cuda-bench 150 "$B/cuda.test" -test.run '^$' -test.benchtime 20x \
	-test.bench 'Ops/attention_(fwd_(8x2048|2x16384)|bwd_8x2048|spans_fwd)')"
grep -h 'ns/op' "$OUT/logs/cuda-bench.log" | tee -a "$OUT/summary.txt"

one() { # MODEL NAME ENV...: the step with recompute auto
	local m=$1 n=$2
	shift 2
	split_env "$@"
	say "$(budgeted "$n" 200 env "${ENVS[@]}" "$B/rlbench" --backend cuda --config "examples/models/$m/config.json" \
		--seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 \
		--recompute-auto --cache "$C" -q --out "$OUT/attn/$n.json")"
}
for m in $MODELS; do
	for r in $(seq 1 "$ROUNDS"); do
		one "$m" "$m-wg-$r" RLPIPE_CUDA_FWD_WS=0
		one "$m" "$m-wsnopp-$r" RLPIPE_CUDA_FWD_PINGPONG=0
		one "$m" "$m-ws-$r"
	done
done
python3 - "$OUT/attn" <<'PY' | tee -a "$OUT/summary.txt"
import glob, json, os, statistics, sys
runs = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    r = json.load(open(f))
    if r.get("status") != "ok":
        continue
    m, v, _ = os.path.basename(f)[:-5].rsplit("-", 2)
    runs.setdefault((m, v), []).append((r["ref_logprob"]["tokens_per_s"], r["train"]["tokens_per_s"]))
print("\ntokens/s, the median over the rounds (ratio to wg)")
print("| model | forward | runs | ref_logprob | vs wg | train | vs wg |")
print("|---|---|---|---:|---:|---:|---:|")
for m in sorted({k[0] for k in runs}):
    base = runs.get((m, "wg"))
    br = statistics.median(x[0] for x in base) if base else 0
    bt = statistics.median(x[1] for x in base) if base else 0
    for v in ("wg", "wsnopp", "ws"):
        xs = runs.get((m, v))
        if not xs:
            continue
        rf, t = statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs)
        vs = lambda a, b: f"{a / b:.3f}x" if b else "-"
        print(f"| {m} | {v} | {len(xs)} | {rf:,.0f} | {vs(rf, br)} | {t:,.0f} | {vs(t, bt)} |")
PY
tar czf "$OUT/attn.tgz" -C "$OUT" attn logs && rm -rf "$OUT/attn" "$OUT/logs"
say "done"
