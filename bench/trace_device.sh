#!/usr/bin/env bash
# Where dp > 1 loses its time (issues 11 and 13): rlpipe keeps 90-92% of
# its one-GPU speed per GPU at dp 4 on four H200s, the PyTorch peer 94-97%,
# and ref_logprob, which only gathers, loses about the time of its
# all-gathers, as if they ran alone. rlbench --profile cannot tell (it
# syncs every op, which serialises the streams), and Nsight Systems does
# not run on the device machines (KINDS.md), so this records rlbench's
# timeline (--timeline: timed CUDA events at every op, around the side
# stream's gathers and reductions and around the compute stream's waits
# for them; nothing synced) in one device call on 2 or more GPUs:
#
#   - at dp 1 and at every GPU visible, with the defaults (among them
#     apply_fsdp2's overlap_reduce auto, which the plan turns on at dp > 1
#     where it fits);
#   - at every GPU with RLPIPE_NCCL_GROUP=0 (a unit's collectives one
#     NCCL call a tensor, not one group), with --overlap-reduce=false (the
#     grads reduced on the compute stream) and with --prefetch 2.
#
# For each run it reports rank 0's last step: its span on the device, the
# time the side stream was busy, and the time the compute stream stood
# waiting for it, per stage and what it waited for (the communication
# the step did not hide); the Chrome traces (chrome://tracing, Perfetto) come back in
# trace.tgz. Build first:
#
#   go build -ldflags='-s -w' -o .devbin/rlbench ./bench/cmd/rlbench
#
# Knobs: TRACE_MODEL (qwen2.5-1.5b), TRACE_DP (every GPU visible, at most
# 8), TRACE_BUDGET_S (540). $OUT gets summary.txt and trace.tgz.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/trace-out}
M=${TRACE_MODEL:-qwen2.5-1.5b}
BUDGET=${TRACE_BUDGET_S:-540}
. bench/device_lib.sh # visible_dp, outdirs, say, budgeted, bench_step
visible_dp "${TRACE_DP:-}"
outdirs trace
export NCCL_NVLS_ENABLE=0
say "start: $M at dp 1 and $DP on $NGPU GPUs, budget ${BUDGET}s"

# traced NAME DP [ENV=...] [FLAGS...]: rlbench's step at dp DP (1 warm-up,
# 2 timed steps) with its timeline, the JSON and the trace in trace/.
traced() { bench_step "$1" "$2" "$M" 2 "$OUT/trace/$1.json" "${@:3}" --timeline "$OUT/trace/$1.trace.json"; }

traced dp1 1
if ((DP > 1)); then
	traced "dp$DP" "$DP"
	traced "dp$DP-nogroup" "$DP" RLPIPE_NCCL_GROUP=0
	traced "dp$DP-noreduce" "$DP" --overlap-reduce=false
	traced "dp$DP-prefetch2" "$DP" --prefetch 2
	traced "dp$DP-again" "$DP"
fi

python3 - "$OUT/trace" <<'PY' | tee -a "$OUT/summary.txt"
import glob, json, os, sys
print("\nrank 0's last step (ms): span on the device, side stream busy, compute stream waiting for the side stream (in all, then the largest by stage and what it waited for)")
print("| run | ref_logprob tok/s per GPU | train tok/s per GPU | span | side busy | compute waited | largest waits |")
print("|---|---:|---:|---:|---:|---:|---|")
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    if p.endswith(".trace.json"):
        continue
    r = json.load(open(p))
    tl = r.get("timeline")
    n = (r.get("workload") or {}).get("dp") or 1
    tps = lambda k: ((r.get(k) or {}).get("tokens_per_s") or 0) / n
    if not tl:
        print(f"| {os.path.basename(p)[:-5]} | {r.get('status', '?')}: no timeline | | | | | |")
        continue
    top = sorted(tl["wait_by_op_s"].items(), key=lambda kv: -kv[1])[:4]
    tops = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in top)
    print(f"| {os.path.basename(p)[:-5]} | {tps('ref_logprob'):,.0f} | {tps('train'):,.0f} | {tl['span_s'] * 1e3:,.1f} | {tl['side_s'] * 1e3:,.1f} "
          f"| {tl['wait_s'] * 1e3:,.1f} | {tops} |")
PY
tar czf "$OUT/trace.tgz" -C "$OUT" trace logs && rm -rf "$OUT/trace" "$OUT/logs"
say "done"
