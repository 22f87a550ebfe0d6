#!/usr/bin/env bash
# Best against best on one GPU, in one call: for each model, the PyTorch
# FSDP2 peer without activation checkpointing and with it (the wrapper, or
# HF's own if the wrapper fails), each eager and with its decoder layers
# under torch.compile, and rlpipe with recompute auto (the plan's
# fastest configuration that fits) and with every layer recomputed; then
# each side's fastest train run that finished, their ratio, and
# bench/compare.py's table (tokens/s, MFU, memory) of the two. rlpipe's auto
# run goes first; the peers then start from its random checkpoint and take
# its rollouts (peer_fsdp2.py --weights, --rollouts), so that the two
# sides' grad norms are those of the same weights and data. Build first:
#
#   go build -ldflags='-s -w' -o .devbin/rlbench ./bench/cmd/rlbench
#
# Knobs: FAIR_MODELS ("qwen2.5-1.5b qwen2.5-3b"), FAIR_BUDGET_S (540),
# FAIR_RUNS (of "peer-noac peer-ac peer-noac-compile peer-ac-compile auto
# recompute"; all by default; the -compile runs are the peer with each
# decoder layer under torch.compile, peer_fsdp2.py --compile layers; also
# "auto-offref", rlpipe's auto with the frozen reference's params in pinned
# host memory, streamed for its forward, which leaves the train stage more
# of the device; "auto-nokeep", rlpipe's auto with
# RLPIPE_CUDA_GEMM_SWIGLU_KEEP=0, the train stage's forwards without the
# fused gate/up kernel, as before it was on by default; auto is compared
# with it, and it is not counted as rlpipe's best),
# FAIR_STEPS (3): each run's timed steps (both sides read the GPU's energy
# counter over them, which moves every 100 ms: more steps, a closer figure),
# FAIR_SEQS (8) and FAIR_TOKENS (2048): each GPU's sequences and the
# tokens of each (64 of them prompt), so FAIR_SEQS=2 FAIR_TOKENS=8192 is
# the same 16384 tokens a step in longer sequences,
# FAIR_PEER_SDPA (default: every peer run with PyTorch's choice of
# attention kernel; flash or cudnn: peer_fsdp2.py --sdpa, that backend
# alone),
# FAIR_DP (1: with more, rlbench --dp FAIR_DP and the peer under
# torch.distributed.run, one process per GPU, FAIR_SEQS sequences a GPU
# on both sides; tokens/s are the whole step's),
# FAIR_BASE (a second rlbench, e.g. one built from an earlier commit: its
# auto run is added per model as base-MODEL-auto and compared with
# rlpipe's, not counted as rlpipe's best),
# FAIR_BOUND (1: per model one more rlpipe auto run with a timeline,
# trace-MODEL-auto, not counted as rlpipe's best; at the end
# bench/gemm_peak.py's square-product rate and bench/bound.py on each
# trace against the peer's runs of its model, into bound-MODEL.md: what
# each stage is made of and the fastest it could be).
# JSON, logs (tarred, with each run's GPU samples: budgeted in
# bench/device_lib.sh) and best.md to $OUT. The summary's line per model
# says "best against best" only where the peer ran both with and without
# activation checkpointing (one that failed counts as run); otherwise it
# says "NOT best against best" and which runs the peer had.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fair-out}
mkdir -p "$OUT/logs"
MODELS=${FAIR_MODELS:-"qwen2.5-1.5b qwen2.5-3b"}
BUDGET=${FAIR_BUDGET_S:-540}
RUNS=" ${FAIR_RUNS:-peer-noac peer-ac peer-noac-compile peer-ac-compile auto recompute} "
want() { [[ $RUNS == *" $1 "* ]]; }
C=${RLBENCH_CACHE:-/tmp/rbc}
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
DP=${FAIR_DP:-1}
SEQS=${FAIR_SEQS:-8} TOKENS=${FAIR_TOKENS:-2048}
W=(--seqs $((SEQS * DP)) --tokens-per-seq "$TOKENS" --prompt-tokens 64 --chunk 2048 --warmup 1 --steps "${FAIR_STEPS:-3}")
# rlbench's ranks and the peer's launcher at FAIR_DP.
RD=() PEER=(python3)
if ((DP > 1)); then
	RD=(--dp "$DP")
	PEER=(python3 -m torch.distributed.run --standalone --nproc_per_node "$DP")
fi
. bench/device_lib.sh # budgeted
# fair_peer LOG JSON LIMIT FLAGS...: the peer on model $m with FLAGS, its
# log logs/peer-$m-LOG.log and its result peer-$m-JSON.json.
fair_peer() {
	local log=$1 json=$2 limit=$3
	shift 3
	budgeted "peer-$m-$log" "$limit" "${PEER[@]}" bench/peer_fsdp2.py --config "$cfg" "${W[@]}" "${P[@]}" --sdpa "${FAIR_PEER_SDPA:-default}" "$@" --out "$OUT/peer-$m-$json.json"
}
for m in $MODELS; do
	cfg=examples/models/$m/config.json
	# rlpipe's auto run first: the peers then start from its random
	# checkpoint and its rollouts (kept in work-$m), so that the two sides'
	# grad norms are those of the same weights and data.
	want auto && budgeted "rlpipe-$m-auto" 150 .devbin/rlbench --backend cuda --config "$cfg" "${W[@]}" "${RD[@]}" --precision bf16 --recompute-auto --cache "$C" --workdir "$OUT/work-$m" --out "$OUT/rlpipe-$m-auto.json"
	mapfile -t P < <(peer_inputs "$OUT/rlpipe-$m-auto.json" "$OUT/work-$m")
	want peer-noac && fair_peer noac noac 150 --ac none
	want peer-ac && { fair_peer ac ac 150 || fair_peer achf ac 150 --ac hf; }
	want peer-noac-compile && fair_peer noac-compile noac-compile 240 --ac none --compile layers
	want peer-ac-compile && fair_peer ac-compile ac-compile 240 --compile layers
	want peer-noac-compile-refrep && fair_peer noac-compile-refrep noac-compile-refrep 240 --ac none --compile layers --ref-replicate
	want peer-ac-compile-refrep && fair_peer ac-compile-refrep ac-compile-refrep 240 --compile layers --ref-replicate
	want auto-shardref && budgeted "rlpipe-$m-auto-shardref" 150 .devbin/rlbench --backend cuda --config "$cfg" "${W[@]}" "${RD[@]}" --precision bf16 --recompute-auto --ref-replicate=false --cache "$C" --out "$OUT/rlpipe-$m-auto-shardref.json"
	want auto-offref && budgeted "rlpipe-$m-auto-offref" 150 .devbin/rlbench --backend cuda --config "$cfg" "${W[@]}" "${RD[@]}" --precision bf16 --recompute-auto --offload-ref --cache "$C" --out "$OUT/rlpipe-$m-auto-offref.json"
	want auto-nokeep && RLPIPE_CUDA_GEMM_SWIGLU_KEEP=0 budgeted "nokeep-$m-auto" 150 .devbin/rlbench --backend cuda --config "$cfg" "${W[@]}" "${RD[@]}" --precision bf16 --recompute-auto --cache "$C" --out "$OUT/nokeep-$m-auto.json"
	want recompute && budgeted "rlpipe-$m-recompute" 120 .devbin/rlbench --backend cuda --config "$cfg" "${W[@]}" "${RD[@]}" --precision bf16 --recompute --cache "$C" --out "$OUT/rlpipe-$m-recompute.json"
	if [[ -n ${FAIR_BASE:-} ]]; then
		budgeted "base-$m-auto" 150 "$FAIR_BASE" --backend cuda --config "$cfg" "${W[@]}" "${RD[@]}" --precision bf16 --recompute-auto --cache "$C" --out "$OUT/base-$m-auto.json"
	fi
	if [[ ${FAIR_BOUND:-} == 1 ]]; then
		budgeted "trace-$m-auto" 150 .devbin/rlbench --backend cuda --config "$cfg" "${W[@]}" "${RD[@]}" --precision bf16 --recompute-auto --cache "$C" --out "$OUT/trace-$m-auto.json" --timeline "$OUT/trace-$m.trace.json"
	fi
done
python3 - "$OUT" $MODELS >"$OUT/best.md" 2>&1 <<'PY'
import glob, json, os, shutil, subprocess, sys
out, models = sys.argv[1], sys.argv[2:]
os.makedirs(f"{out}/best", exist_ok=True)
def tps(r, stage):
    return ((r.get(stage) or {}).get("tokens_per_s") or 0.0)
def ok(r):
    return r.get("status", "ok") == "ok" and tps(r, "train") > 0
print("| model | side | run | train tok/s | ref_logprob tok/s |")
print("|---|---|---|---|---|")
best, best_ref, tried = {}, {}, {}
for m in models:
    for side in ("peer", "rlpipe"):
        runs = []
        for p in sorted(glob.glob(f"{out}/{side}-{m}-*.json")):
            r = json.load(open(p))
            name = os.path.basename(p)[len(side) + len(m) + 2:-5]
            tried.setdefault((m, side), set()).add(name)
            print(f"| {m} | {side} | {name} | {tps(r, 'train'):,.0f} | {tps(r, 'ref_logprob'):,.0f} |" if ok(r) else f"| {m} | {side} | {name} | failed: {(r.get('error') or '?').splitlines()[-1][:80]} | |")
            if ok(r):
                runs.append((tps(r, "train"), p, name, r))
        if runs:
            best[(m, side)] = max(runs)
            best_ref[(m, side)] = max((tps(r, "ref_logprob"), name) for _, _, name, r in runs)
            shutil.copy(best[(m, side)][1], f"{out}/best/{side}-{m}.json")
print()
for m in models:
    p, q = best.get((m, "peer")), best.get((m, "rlpipe"))
    if p and q:
        # Each side's fastest ref_logprob over its runs: the reference's
        # forward does not depend on the actor's checkpointing, and a run
        # slower to train may be faster there.
        rp, rq = best_ref[(m, "peer")], best_ref[(m, "rlpipe")]
        # The peer's best needs its runs both with and without activation
        # checkpointing (one that failed, out of memory, counts as tried):
        # which is faster depends on the model and the GPU.
        names = tried[(m, "peer")]
        both = any(n.startswith("noac") for n in names) and any(n.startswith("ac") for n in names)
        label = "best against best" if both else \
            f"NOT best against best (the peer ran {', '.join(sorted(names))} only, not with and without AC)"
        print(f"{m}: {label}, train {q[0]:,.0f} ({q[2]}) / {p[0]:,.0f} ({p[2]}) = {q[0] / p[0]:.2f}x; "
              f"ref_logprob {rq[0]:,.0f} ({rq[1]}) / {rp[0]:,.0f} ({rp[1]}) = {rq[0] / max(rp[0], 1):.2f}x")
# The newer of each pair over the older: auto over FAIR_BASE's auto, and
# over auto-nokeep.
for m in models:
    for new, old, what in (("rlpipe", "base", "auto / base auto (FAIR_BASE)"), ("rlpipe", "nokeep", "auto / auto-nokeep")):
        try:
            a, b = json.load(open(f"{out}/{new}-{m}-auto.json")), json.load(open(f"{out}/{old}-{m}-auto.json"))
        except Exception:
            continue
        if ok(a) and ok(b):
            print(f"{m}: {what}: train {tps(a, 'train') / tps(b, 'train'):.3f}x ({tps(a, 'train'):,.0f} / {tps(b, 'train'):,.0f}), "
                  f"ref_logprob {tps(a, 'ref_logprob') / tps(b, 'ref_logprob'):.3f}x")
print()
files = sorted(glob.glob(f"{out}/best/*.json"))
if files:
    print(subprocess.run([sys.executable, "bench/compare.py", *files], capture_output=True, text=True).stdout)
PY
cat "$OUT/best.md"
if [[ ${FAIR_BOUND:-} == 1 ]]; then
	# Without the square product's rate, no bound at that rate.
	peak=(--peak-tflops 0)
	python3 bench/gemm_peak.py --out "$OUT/peak.json" >"$OUT/logs/gemm_peak.log" 2>&1 && peak=(--peak-json "$OUT/peak.json")
	for m in $MODELS; do
		[[ -f $OUT/trace-$m-auto.json && -f $OUT/trace-$m.trace.json ]] || continue
		python3 bench/bound.py "$OUT/trace-$m-auto.json" "$OUT/trace-$m.trace.json" "$OUT"/peer-$m-*.json \
			"${peak[@]}" >"$OUT/bound-$m.md" 2>&1
		grep -A8 '^| bound' "$OUT/bound-$m.md"
	done
fi
# At most 8 files come back from a device call: the JSON and the traces go
# in a tarball.
(cd "$OUT" && tar czf logs.tgz logs ./*.json && rm -rf logs ./*.json)
