#!/usr/bin/env bash
# Where dp > 1 loses its time (issues 11 and 13): rlpipe keeps 90-92% of
# its one-GPU speed per GPU at dp 4 on four H200s, the PyTorch peer 94-97%,
# and ref_logprob, which only gathers, loses about the time of its
# all-gathers, as if they ran alone. rlbench --profile cannot tell (it
# syncs every op, which serialises the streams), so this traces the
# benchmark step with Nsight Systems, unsynced, in one device call on 2 or
# 4 GPUs, and measures from the kernels' own start and end times:
#
#   - per GPU: the time some compute kernel runs, the time some NCCL
#     kernel runs, and how much of the NCCL time no compute kernel
#     overlaps (exposed communication);
#   - the compute stream's idle time between its kernels (the stream
#     waiting, for a gather or for the host);
#   - the same at dp 1 for comparison, where the gathers are copies.
#
# Build first:
#
#   go build -ldflags='-s -w' -o .devbin/rlbench ./bench/cmd/rlbench
#
# Knobs: TRACE_MODEL (qwen2.5-1.5b), TRACE_DP (every GPU visible, at most
# 8), TRACE_ENV (extra environment for the traced runs, e.g.
# "RLPIPE_NCCL_GROUP=1"). Needs nsys on the device (the CUDA toolkit's);
# without it, it says so and stops. $OUT gets summary.txt (the table) and
# trace.tgz (the nsys reports' kernel CSVs and the logs); the .nsys-rep
# files stay on the device (too large to bring back).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/trace-out}
M=${TRACE_MODEL:-qwen2.5-1.5b}
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
DP=${TRACE_DP:-$((NGPU > 8 ? 8 : NGPU))}
read -r -a EXTRA <<<"${TRACE_ENV:-}"
B=$PWD/.devbin
C=/tmp/rbc
W=/tmp/rlpipe-trace
mkdir -p "$OUT/trace" "$OUT/logs" "$W"
OUT=$(realpath "$OUT")
D=$OUT
BUDGET=${TRACE_BUDGET_S:-540}
. bench/device_lib.sh # say, budgeted
export NCCL_NVLS_ENABLE=0
NSYS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -n 1)
if [[ -z $NSYS ]]; then
	say "no nsys on this machine: nothing traced (which ncu: $(command -v ncu || echo none))"
	exit 0
fi
say "start: $M at dp 1 and $DP on $NGPU GPUs, $("$NSYS" --version 2>&1 | head -n 1)"

# traced NAME DP: rlbench's step at dp DP under nsys (1 warm-up, 2 timed
# steps), then the kernel trace as CSV in trace/NAME.csv.
traced() {
	local n=$1 dp=$2
	# A run without nsys first, so that the traced one finds the random
	# checkpoint and the kernels in the caches.
	[[ -e $W/warm-$dp ]] || { budgeted "warm-$n" 240 "$B/rlbench" --backend cuda --config "examples/models/$M/config.json" --dp "$dp" \
		--seqs $((8 * dp)) --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 0 --steps 1 --precision bf16 \
		--recompute --cache "$C" -q --out "$W/warm-$dp.json" && touch "$W/warm-$dp"; }
	say "$(budgeted "$n" 240 env "${EXTRA[@]}" "$NSYS" profile -t cuda,nvtx -s none --cpuctxsw none -o "$W/$n" --force-overwrite true \
		"$B/rlbench" --backend cuda --config "examples/models/$M/config.json" --dp "$dp" \
		--seqs $((8 * dp)) --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 2 --precision bf16 \
		--recompute --cache "$C" -q --out "$OUT/trace/$n.json")"
	say "$(budgeted "stats-$n" 120 "$NSYS" stats -r cuda_gpu_trace -f csv -o "$OUT/trace/$n" --force-export true "$W/$n.nsys-rep")"
}

traced dp1 1
((DP > 1)) && traced "dp$DP" "$DP"

python3 - "$OUT/trace" <<'PY' | tee -a "$OUT/summary.txt"
import csv, glob, os, sys

def union(iv):
    """Total length of the union of [start, end) intervals."""
    tot, cur_s, cur_e = 0, None, None
    for s, e in sorted(iv):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                tot += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        tot += cur_e - cur_s
    return tot

def minus(a, b):
    """Length of the union of a less the union of b."""
    return union(a + b) - union(b)

print("\nper GPU, over the traced run (setup, 1 warm-up and 2 timed steps; ms): compute = some non-NCCL kernel running; nccl = some NCCL kernel;"
      " exposed = NCCL with no compute kernel running; idle = the busiest stream's gaps between its first and last kernel")
print("| run | GPU | span | compute | nccl | exposed nccl | compute stream idle |")
print("|---|---|---:|---:|---:|---:|---:|")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*cuda_gpu_trace.csv"))):
    run = os.path.basename(path).split("_cuda_gpu_trace")[0]
    kern = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            name = r.get("Name", "")
            if name.startswith("[CUDA"):
                continue  # copies and memsets
            s = int(float(r["Start (ns)"]))
            e = s + int(float(r["Duration (ns)"]))
            dev = r.get("Device", "?")
            kern.setdefault(dev, []).append((s, e, r.get("Strm", "?"), "nccl" in name.lower()))
    for dev, ks in sorted(kern.items()):
        comp = [(s, e) for s, e, _, n in ks if not n]
        comm = [(s, e) for s, e, _, n in ks if n]
        streams = {}
        for s, e, st, n in ks:
            if not n:
                streams.setdefault(st, []).append((s, e))
        main = max(streams.values(), key=lambda v: sum(e - s for s, e in v)) if streams else []
        span = (max(e for _, e, _, _ in ks) - min(s for s, _, _, _ in ks)) if ks else 0
        idle = (max(e for _, e in main) - min(s for s, _ in main) - union(main)) if main else 0
        ms = lambda x: f"{x / 1e6:,.1f}"
        print(f"| {run} | {dev} | {ms(span)} | {ms(union(comp))} | {ms(union(comm))} | {ms(minus(comm, comp))} | {ms(idle)} |")
PY
tar czf "$OUT/trace.tgz" -C "$OUT" trace logs 2>/dev/null && rm -rf "$OUT/trace" "$OUT/logs"
say "done"
