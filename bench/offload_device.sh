#!/usr/bin/env bash
# The offloaded train step against the PyTorch FSDP2 peer, in one call on
# one GPU: for each model, the peer with its actor under CPUOffloadPolicy
# (without activation checkpointing first, with it if that fails), eager
# and with its decoder layers under torch.compile; rlpipe
# with the actor offloaded (params and optimizer state in pinned host
# memory, AdamW on the host) with the host AdamW finished within its op
# (--sync-host-optimizer, as before the overlap) and overlapped with the
# next ops (the default); and rlpipe without offload, for the offloaded
# step's cost. rlpipe's runs use recompute auto. Build first:
#
#   go build -ldflags='-s -w' -o .devbin/rlbench ./bench/cmd/rlbench
#
# Knobs: OFFLOAD_MODELS ("qwen2.5-1.5b qwen2.5-3b"), OFFLOAD_BUDGET_S (560),
# OFFLOAD_RUNS (the runs to make per model, of "overlap sync peer
# peer-compile resident"; all five by default; also "noreshard", rlpipe overlapped with the actor's
# units kept gathered from forward to backward, "bf16copy", rlpipe
# overlapped with apply_fsdp2's host_bf16_copy, "peer-noreshard", the
# peer likewise, reshard_after_forward=False, with activation checkpointing
# only if it fails without, and "noclip" and "resident-noclip", rlpipe
# offloaded (overlapped) and resident with train.grad_clip 0, where each
# unit's host AdamW starts as its grads reach the host), "peer-compile",
# the peer as "peer" with each decoder layer under torch.compile
# (peer_fsdp2.py --compile layers; the summary compares rlpipe with the
# faster of the two peers),
# OFFLOAD_CANDIDATE (a second rlbench, e.g. .devbin/rlbench-candidate built
# from a branch: its overlapped offload run is added to each model's rows),
# OFFLOAD_MICRO (1: updates of M micro-batches of 8/M sequences on both
# sides, rlbench's --max-tokens-per-gpu and the peer's --micro-batches,
# with its grads reduced only after the last one, FSDP2's fastest way:
# OFFLOAD_PEER_SYNC=each reduces them after each).
# JSON, logs (tarred) and summary.md to $OUT.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/offload-out}
mkdir -p "$OUT/logs"
MODELS=${OFFLOAD_MODELS:-"qwen2.5-1.5b qwen2.5-3b"}
BUDGET=${OFFLOAD_BUDGET_S:-560}
RUNS=" ${OFFLOAD_RUNS:-overlap sync peer peer-compile resident} "
want() { [[ $RUNS == *" $1 "* ]]; }
C=${RLBENCH_CACHE:-/tmp/rbc}
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
W=(--seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3)
# OFFLOAD_MICRO=M splits each update into M micro-batches on both sides:
# rlbench's --max-tokens-per-gpu, the peer's --micro-batches.
MICRO=${OFFLOAD_MICRO:-1}
RW=() PW=()
if ((MICRO > 1)); then
	RW=(--max-tokens-per-gpu $((8 * 2048 / MICRO)))
	PW=(--micro-batches "$MICRO" --grad-sync "${OFFLOAD_PEER_SYNC:-last}")
fi
. bench/device_lib.sh # budgeted
# offload_peer NAME LIMIT FLAGS...: the peer on model $m with FLAGS,
# without activation checkpointing (NAME-noac) and, if that fails, with
# it (NAME-ac), each logged as and written to NAME-*.
offload_peer() {
	local n=$1 limit=$2
	shift 2
	budgeted "$n-noac" "$limit" python3 bench/peer_fsdp2.py --config "$cfg" "${W[@]}" "${PW[@]}" "${P[@]}" "$@" --ac none --out "$OUT/$n-noac.json" ||
		budgeted "$n-ac" "$limit" python3 bench/peer_fsdp2.py --config "$cfg" "${W[@]}" "${PW[@]}" "${P[@]}" "$@" --out "$OUT/$n-ac.json"
}
nproc >"$OUT/logs/host.txt"
free -g >>"$OUT/logs/host.txt"
for m in $MODELS; do
	cfg=examples/models/$m/config.json
	want overlap && budgeted "rlpipe-$m-offload-overlap" 150 .devbin/rlbench --backend cuda --config "$cfg" "${W[@]}" "${RW[@]}" --precision bf16 --recompute-auto --offload --cache "$C" --workdir "$OUT/work-$m" --out "$OUT/rlpipe-$m-offload-overlap.json"
	# The peers start from that run's random checkpoint and rollouts.
	mapfile -t P < <(peer_inputs "$OUT/rlpipe-$m-offload-overlap.json" "$OUT/work-$m")
	if [[ -n ${OFFLOAD_CANDIDATE:-} ]]; then
		budgeted "rlpipe-$m-offload-candidate" 150 "$OFFLOAD_CANDIDATE" --backend cuda --config "$cfg" "${W[@]}" "${RW[@]}" --precision bf16 --recompute-auto --offload --cache "$C" --out "$OUT/rlpipe-$m-offload-candidate.json"
	fi
	want sync && budgeted "rlpipe-$m-offload-sync" 150 .devbin/rlbench --backend cuda --config "$cfg" "${W[@]}" "${RW[@]}" --precision bf16 --recompute-auto --offload --sync-host-optimizer --cache "$C" --out "$OUT/rlpipe-$m-offload-sync.json"
	want peer && offload_peer "peer-$m-offload" 150 --offload
	want peer-compile && offload_peer "peer-$m-offload-compile" 240 --offload --compile layers
	want bf16copy && budgeted "rlpipe-$m-offload-bf16copy" 150 .devbin/rlbench --backend cuda --config "$cfg" "${W[@]}" "${RW[@]}" --precision bf16 --recompute-auto --offload --host-bf16-copy --cache "$C" --out "$OUT/rlpipe-$m-offload-bf16copy.json"
	want noreshard && budgeted "rlpipe-$m-offload-noreshard" 150 .devbin/rlbench --backend cuda --config "$cfg" "${W[@]}" "${RW[@]}" --precision bf16 --recompute-auto --offload --no-reshard --cache "$C" --out "$OUT/rlpipe-$m-offload-noreshard.json"
	want peer-noreshard && offload_peer "peer-$m-offload-noreshard" 150 --offload --no-reshard
	want noclip && budgeted "rlpipe-$m-offload-noclip" 150 .devbin/rlbench --backend cuda --config "$cfg" "${W[@]}" "${RW[@]}" --precision bf16 --recompute-auto --offload --no-grad-clip --cache "$C" --out "$OUT/rlpipe-$m-offload-noclip.json"
	want resident-noclip && budgeted "rlpipe-$m-resident-noclip" 120 .devbin/rlbench --backend cuda --config "$cfg" "${W[@]}" "${RW[@]}" --precision bf16 --recompute-auto --no-grad-clip --cache "$C" --out "$OUT/rlpipe-$m-resident-noclip.json"
	want resident && budgeted "rlpipe-$m-resident" 120 .devbin/rlbench --backend cuda --config "$cfg" "${W[@]}" "${RW[@]}" --precision bf16 --recompute-auto --cache "$C" --out "$OUT/rlpipe-$m-resident.json"
done
python3 - "$OUT" $MODELS >"$OUT/summary.md" 2>&1 <<'PY'
import glob, json, os, sys
out, models = sys.argv[1], sys.argv[2:]
def load(p):
    try:
        r = json.load(open(p))
    except Exception:
        return None
    return r if r.get("status", "ok") == "ok" and (r.get("train") or {}).get("tokens_per_s") else None
def tps(r, k):
    return ((r or {}).get(k) or {}).get("tokens_per_s") or 0.0
def step_tps(r):
    # ref_logprob + train per step: the overlap moves host AdamW time
    # between the two, so the step is the figure to compare.
    ref, tr = (r.get("ref_logprob") or {}), (r.get("train") or {})
    s = (ref.get("median_s") or 0) + (tr.get("median_s") or 0)
    return (tr.get("tokens") or 0) / s if s else 0.0
print("| model | run | ref_logprob tok/s | train tok/s | ref+train tok/s | step (wall) tok/s |")
print("|---|---|---:|---:|---:|---:|")
runs = {}
for m in models:
    for p in sorted(glob.glob(f"{out}/*-{m}-*.json")):
        name = os.path.basename(p)[:-5]
        r = load(p)
        if r is None:
            print(f"| {m} | {name} | failed | | | |")
            continue
        runs[name] = r
        print(f"| {m} | {name} | {tps(r, 'ref_logprob'):,.0f} | {tps(r, 'train'):,.0f} | {step_tps(r):,.0f} | {tps(r, 'step'):,.0f} |")
print()
for m in models:
    ov, sy, res = runs.get(f"rlpipe-{m}-offload-overlap"), runs.get(f"rlpipe-{m}-offload-sync"), runs.get(f"rlpipe-{m}-resident")
    # The peer's fastest train run, eager or compiled.
    peers = [(tps(runs[n], "train"), n) for n in (f"peer-{m}-offload-{v}" for v in ("noac", "ac", "compile-noac", "compile-ac")) if n in runs]
    peer_name = max(peers)[1] if peers else ""
    peer = runs.get(peer_name)
    cand = runs.get(f"rlpipe-{m}-offload-candidate")
    nr = runs.get(f"rlpipe-{m}-offload-noreshard")
    bc = runs.get(f"rlpipe-{m}-offload-bf16copy")
    pnr = runs.get(f"peer-{m}-offload-noreshard-noac") or runs.get(f"peer-{m}-offload-noreshard-ac")
    nc, rnc = runs.get(f"rlpipe-{m}-offload-noclip"), runs.get(f"rlpipe-{m}-resident-noclip")
    # (label, numerator, denominator, whether ref+train is compared too)
    for label, a, b, both in [
        ("noreshard / overlap", nr, ov, True),
        ("bf16copy / overlap", bc, ov, True),
        ("resident / offloaded (bf16copy)", res, bc, True),
        ("peer noreshard / peer", pnr, peer, False),
        ("resident / offloaded (noreshard)", res, nr, True),
        ("candidate / overlap", cand, ov, True),
        ("overlap / sync", ov, sy, True),
        (f"offloaded, rlpipe overlap / peer ({peer_name})", ov, peer, True),
        ("resident / offloaded (overlap)", res, ov, True),
        ("without clipping, resident / offloaded", rnc, nc, True),
    ]:
        # step (wall) is the fairest figure: it counts the time between
        # steps in which the host AdamW also goes on.
        if a and b:
            line = f"{m}: {label}: train {tps(a, 'train') / tps(b, 'train'):.2f}x"
            if both:
                line += f", ref+train {step_tps(a) / step_tps(b):.2f}x"
                if tps(a, 'step') and tps(b, 'step'):  # the peer reports no step
                    line += f", step (wall) {tps(a, 'step') / tps(b, 'step'):.2f}x"
            print(line)
PY
cat "$OUT/summary.md"
# At most 8 files come back from a device call: the JSON goes in a tarball.
(cd "$OUT" && tar czf logs.tgz logs ./*.json && rm -rf logs ./*.json)
