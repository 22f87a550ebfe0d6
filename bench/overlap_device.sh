#!/usr/bin/env bash
# A/B of the communication overlap switches at dp > 1, in one device call
# on 2 or 4 GPUs (issues 11 and 13: rlpipe kept 90-92% of its one-GPU speed
# per GPU at dp 4 on four H200s, the PyTorch peer 94-97%). The benchmark
# step of bench/scale_device.sh's dp phase (every layer recomputed, 8 × 2048
# tokens per GPU) by one rlbench build, alternated over OVERLAP_ROUNDS
# rounds, in seven variants:
#
#   base      as it is (the side stream at the device's greatest
#             priority, and a unit's per-parameter all-gathers, and its
#             grads' reduce-scatters, as one NCCL group each: the
#             defaults since these runs first went; and apply_fsdp2's
#             overlap_reduce auto, which the plan turns on where it fits)
#   noprio    RLPIPE_CUDA_SIDE_PRIORITY=0 (the side stream at the default
#             priority)
#   nogroup   RLPIPE_NCCL_GROUP=0 (one NCCL call, and kernel, a tensor)
#   reduce    --overlap-reduce=true (apply_fsdp2 overlap_reduce written;
#             where the plan chooses it anyway, base's run again, so only
#             when OVERLAP_VARIANTS names it)
#   noreduce  --overlap-reduce=false (the grads reduced on the compute
#             stream)
#   ctas8     NCCL_MIN_CTAS=8 NCCL_MAX_CTAS=8 (NCCL's kernels on 8 SMs,
#             leaving the rest to the compute they overlap)
#   pf2       --prefetch 2 (both models' units gathered two ahead)
#
# and then, once, base at dp 1 for the efficiency. Build first:
#
#   go build -ldflags='-s -w' -o .devbin/rlbench ./bench/cmd/rlbench
#
# Knobs: OVERLAP_MODELS ("qwen2.5-1.5b qwen2.5-3b"), OVERLAP_DP (every GPU
# visible, at most 8), OVERLAP_ROUNDS (2), OVERLAP_BUDGET_S (540),
# OVERLAP_VARIANTS (of the seven above; all but reduce by default), OVERLAP_FLAGS (more
# rlbench flags for every run, dp 1's too: "--recompute-auto" runs the
# plan's fastest configuration that fits instead of every layer
# recomputed). $OUT gets
# summary.txt (the runs as they went and a table: train and ref_logprob
# tokens/s per GPU, each variant's median over the rounds) and json.tgz.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/overlap-out}
MODELS=${OVERLAP_MODELS:-"qwen2.5-1.5b qwen2.5-3b"}
ROUNDS=${OVERLAP_ROUNDS:-2}
BUDGET=${OVERLAP_BUDGET_S:-540}
VARIANTS=" ${OVERLAP_VARIANTS:-base noprio nogroup noreduce ctas8 pf2} "
read -r -a FLAGS <<<"${OVERLAP_FLAGS:-}"
. bench/device_lib.sh # visible_dp, outdirs, say, budgeted, bench_step
visible_dp "${OVERLAP_DP:-}"
outdirs json
export NCCL_NVLS_ENABLE=0
say "start: dp $DP on $NGPU GPUs, models '$MODELS', variants '${VARIANTS# }', flags '${FLAGS[*]}', $ROUNDS rounds, budget ${BUDGET}s"
if ((DP < 2)); then
	say "fewer than 2 GPUs: nothing to compare"
	exit 0
fi

# The grouped collectives, checked before they are timed (nccl/libnccl's
# TestCUDACollectives, when .devbin has libnccl.test:
# go test -c -o .devbin/libnccl.test ./nccl/libnccl).
if [[ -x $B/libnccl.test ]]; then
	say "$(budgeted libnccl-collectives 90 bash -c "cd nccl/libnccl && $(printf %q "$B/libnccl.test") -test.run 'TestCUDACollectives\$' -test.v")"
fi

# one NAME DP MODEL [ENV=...] [FLAGS...]: one rlbench run with
# OVERLAP_FLAGS, its JSON at json/NAME.json.
one() { bench_step "$1" "$2" "$3" 3 "$OUT/json/$1.json" "${@:4}" "${FLAGS[@]}"; }
# variant NAME MODEL ROUND [ENV=...] [FLAGS...]: one run of variant NAME at
# DP, when OVERLAP_VARIANTS names it.
variant() {
	[[ $VARIANTS == *" $1 "* ]] || return 0
	one "$2-$1-$3" "$DP" "$2" "${@:4}"
}

for m in $MODELS; do
	for r in $(seq 1 "$ROUNDS"); do
		variant base "$m" "$r"
		variant noprio "$m" "$r" RLPIPE_CUDA_SIDE_PRIORITY=0
		variant nogroup "$m" "$r" RLPIPE_NCCL_GROUP=0
		variant reduce "$m" "$r" --overlap-reduce=true
		variant noreduce "$m" "$r" --overlap-reduce=false
		variant ctas8 "$m" "$r" NCCL_MIN_CTAS=8 NCCL_MAX_CTAS=8
		variant pf2 "$m" "$r" --prefetch 2
	done
	one "$m-dp1" 1 "$m"
done

python3 - "$OUT/json" "$DP" <<'PY' | tee -a "$OUT/summary.txt"
import glob, json, os, statistics, sys
d, dp = sys.argv[1], int(sys.argv[2])
runs = {}
for f in sorted(glob.glob(os.path.join(d, "*.json"))):
    r = json.load(open(f))
    if r.get("status") != "ok":
        continue
    name = os.path.basename(f)[:-5]
    if name.endswith("-dp1"):
        key = (name[:-4], "dp1")
    else:
        m, v, _ = name.rsplit("-", 2)
        key = (m, v)
    n = r["workload"]["dp"]
    runs.setdefault(key, []).append((r["train"]["tokens_per_s"] / n, r["ref_logprob"]["tokens_per_s"] / n))
print(f"\ntokens/s per GPU at dp {dp}, the median over the rounds (efficiency against dp 1; ratio to base)")
print("| model | variant | runs | train | eff | vs base | ref_logprob | eff | vs base |")
print("|---|---|---|---|---|---|---|---|---|")
for m in sorted({k[0] for k in runs}):
    one = runs.get((m, "dp1"), [(0, 0)])[0]
    base = runs.get((m, "base"))
    bt = statistics.median(x[0] for x in base) if base else 0
    br = statistics.median(x[1] for x in base) if base else 0
    for v in ("base", "noprio", "nogroup", "reduce", "ctas8", "pf2"):
        xs = runs.get((m, v))
        if not xs:
            continue
        t, rf = statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs)
        eff = lambda a, b: f"{a / b:.0%}" if b else "-"
        vs = lambda a, b: f"{a / b:.3f}x" if b else "-"
        print(f"| {m} | {v} | {len(xs)} | {t:,.0f} | {eff(t, one[0])} | {vs(t, bt)} | {rf:,.0f} | {eff(rf, one[1])} | {vs(rf, br)} |")
PY
tar czf "$OUT/json.tgz" -C "$OUT" json logs && rm -rf "$OUT/json" "$OUT/logs"
say "done"
