#!/usr/bin/env python3
"""Compare bench results: peer_fsdp2.py JSON against rlbench JSON.

    python3 bench/compare.py RESULT.json... [--peak-tflops 989]

Results are matched by model (the config's directory name) and offload
setting. Prints markdown tables for docs/performance.md: throughput
(tokens/s per stage, rlpipe/fsdp2 ratio, model FLOP utilisation), memory,
the energy of a step where both sides read the GPU's energy counter,
and the last train step's grad_norm of both sides. fair_device.sh has the
peer start from rlpipe's random checkpoint and rollouts (peer_fsdp2.py
--weights, --rollouts): the norms are then of the same weights and data.
Without them each side draws its own (HF's initialiser against
model.RandomTensors, both normal with std 0.02 but HF zeroes the biases;
rollouts and rewards from different generators) and the norms agree only
as those of two similar problems do, which catches gross errors (stale
grads gave 100 times the norm), not subtle ones.

Throughput counts every token of a step (prompt + response) over the median
step time. Runs with dp > 1 (workload.dp) are their own rows; their MFU is
per GPU. MFU uses the usual model FLOPs, without recomputation:
train 6·P + 12·L·H·S per token, ref_logprob 2·P + 4·L·H·S (P parameters,
L layers, H hidden size, S tokens per sequence; attention counted
non-causal), over the GPU's dense bf16 peak (H100 SXM: 989 TFLOP/s).
"""

import argparse
import json
import os
import sys

GIB = float(1 << 30)


def load(paths):
    out = []
    for p in paths:
        try:
            with open(p) as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            print(f"compare: skipping {p}: {e}", file=sys.stderr)
            continue
        r["_path"] = p
        cfg = r.get("config") or get(r, "model", "config") or ""
        r["_model"] = os.path.basename(os.path.dirname(os.path.abspath(cfg))) if cfg else "?"
        dp = get(r, "workload", "dp") or 1
        if dp > 1:  # data-parallel runs are their own rows
            r["_model"] += f" dp{dp}"
        r["_offload"] = bool(get(r, "workload", "offload"))
        out.append(r)
    return out


def get(r, *keys):
    """r[k1][k2]..., or None where a level is missing or null."""
    for k in keys:
        if not isinstance(r, dict):
            return None
        r = r.get(k)
    return r


def tps(r, stage):
    v = get(r, stage, "tokens_per_s") or 0
    return v if v > 0 else None


def flops_per_token(r, stage):
    p, layers, hidden = get(r, "model", "params"), get(r, "model", "layers"), get(r, "model", "hidden")
    s = get(r, "workload", "tokens_per_seq")
    if not (p and layers and hidden and s):
        return None
    if stage == "train":
        return 6 * p + 12 * layers * hidden * s
    return 2 * p + 4 * layers * hidden * s


def fmt_tps(v):
    return "—" if v is None else f"{v / 1e3:.1f}K"


def fmt_mfu(r, stage, peak):
    v = tps(r, stage)
    f = flops_per_token(r, stage) if r else None
    if v is None or f is None:
        return "—"
    gpus = get(r, "workload", "dp") or 1  # the step's tokens ran on this many GPUs
    return f"{100 * v * f / (peak * gpus):.1f}%"


def fmt_gib(v):
    return "—" if not v else f"{v / GIB:.2f}"


# GRAD_NORM_TOL is the relative difference of the two sides' last grad_norm
# beyond which the table marks them DIFFERS when each side drew its own
# weights and rollouts, and GRAD_NORM_TOL_SHARED when the peer took
# rlpipe's (2026-11-27, H100: 0.07% at 1.5B, 0.11% at 0.5B).
GRAD_NORM_TOL = 0.05
GRAD_NORM_TOL_SHARED = 0.01


def fmt_norm(v):
    return "—" if v is None else f"{v:.5g}"


def shared_inputs(peer, rl):
    """Whether the peer started from rlpipe's checkpoint and rollouts
    (peer_fsdp2.py --weights and --rollouts, as fair_device.sh runs it)."""
    w = get(peer, "workload", "weights")
    return bool(w) and w == get(rl, "checkpoint_path") and bool(get(peer, "workload", "rollouts"))


def agree(a, b, tol):
    """'yes', 'DIFFERS' (more than tol apart, relatively), or '—' when a side has no grad_norm."""
    if a is None or b is None:
        return "—"
    return "yes" if abs(a - b) <= tol * max(abs(a), abs(b)) else "DIFFERS"


def status(r):
    if r is None:
        return "missing"
    if r.get("status") == "ok":
        return "ok"
    err = (r.get("error") or "").strip().splitlines()
    return f"{r.get('status')}: {err[-1][:80] if err else ''}"


def energy_table(keys, by):
    """Prints the energy of a step (ref_logprob and train) on rank 0's GPU
    where both sides measured it: NVML's counter read at the end of the
    last warm-up step and of the last timed one, outside the timed windows
    (rlbench: once over its interleaved steps, which also hold the packing
    and the marks; the peer: once per phase, the two phases added), and
    the mean power over the reads."""
    rows = []
    for k in keys:
        peer, rl = by.get((k, "fsdp2")), by.get((k, "rlpipe"))
        pr, pt, e = get(peer, "ref_logprob", "energy"), get(peer, "train", "energy"), get(rl, "energy")
        if not (pr and pt and e) or not e.get("joules_per_step"):
            continue
        pj = pr["joules_per_step"] + pt["joules_per_step"]
        rows.append(f"| {k[0]} | {'yes' if k[1] else 'no'} | {pj:.1f} | {e['joules_per_step']:.1f} | "
                    f"{pj / e['joules_per_step']:.2f}× | {pr['watts']:.0f}; {pt['watts']:.0f} | {e['watts']:.0f} | "
                    f"{pt['steps']}; {e['steps']} |")
    if not rows:
        return
    print("Energy a step (ref_logprob + train), J, on rank 0's GPU: NVML's counter read at the end of the last warm-up "
          "step and of the last timed one, outside the timed windows (the peer: per phase, added; rlpipe: its "
          "interleaved steps, with the packing and the marks), and the mean power, W, over those reads. The counter "
          "moves every 100 ms on an H200 (bench/energy_probe.py), so a figure is good to about 0.1 s of power over "
          "the steps' time. FSDP2 / rlpipe is how many times the peer's energy rlpipe's is under.\n")
    print("| model | offload | FSDP2 J | rlpipe J | FSDP2 / rlpipe | FSDP2 W (ref; train) | rlpipe W | timed steps (FSDP2; rlpipe) |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for row in rows:
        print(row)
    print()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100 SXM: 989)")
    args = ap.parse_args(argv)
    peak = args.peak_tflops * 1e12
    rs = load(args.results)
    keys = []
    by = {}
    for r in rs:
        k = (r["_model"], r["_offload"])
        if k not in keys:
            keys.append(k)
        by[(k, r.get("impl"))] = r
    keys.sort(key=lambda k: (k[0], k[1]))

    gpus = sorted({r.get("gpu") or r.get("device") or "?" for r in rs})
    print(f"GPU: {', '.join(map(str, gpus))}; MFU against {args.peak_tflops:g} TFLOP/s\n")
    print("| model | offload | stage | FSDP2 tok/s | rlpipe tok/s | rlpipe / FSDP2 | FSDP2 MFU | rlpipe MFU |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for k in keys:
        peer, rl = by.get((k, "fsdp2")), by.get((k, "rlpipe"))
        for stage in ("ref_logprob", "train"):
            a, b = tps(peer, stage), tps(rl, stage)
            ratio = f"{b / a:.2f}×" if a and b else "—"
            print(f"| {k[0]} | {'yes' if k[1] else 'no'} | {stage} | {fmt_tps(a)} | {fmt_tps(b)} | {ratio} | "
                  f"{fmt_mfu(peer, stage, peak)} | {fmt_mfu(rl, stage, peak)} |")
    print()
    energy_table(keys, by)
    print("Memory, GiB. FSDP2: torch.cuda max allocated / max reserved over both phases, and the device's used memory "
          "(CUDA context and NCCL included). rlpipe: the plan's peak and arena, the arena high-water measured in the run, "
          "the device total the plan predicts (arena + reserves) and NVML's used memory.\n")
    print("| model | offload | FSDP2 allocated | FSDP2 reserved | FSDP2 device used | rlpipe plan peak | rlpipe arena | "
          "rlpipe high-water | rlpipe plan total | rlpipe device used | arena / FSDP2 reserved |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k in keys:
        peer, rl = by.get((k, "fsdp2")), by.get((k, "rlpipe"))
        pm = get(peer, "memory") or {}
        rm = get(rl, "memory") or {}
        used = rm.get("nvml_process_bytes") or rm.get("nvml_used_max_bytes")
        ratio = "—"
        if pm.get("peak_reserved_bytes") and rm.get("plan_device_arena_bytes"):
            ratio = f"{rm['plan_device_arena_bytes'] / pm['peak_reserved_bytes']:.2f}×"
        print(f"| {k[0]} | {'yes' if k[1] else 'no'} | {fmt_gib(pm.get('peak_allocated_bytes'))} | {fmt_gib(pm.get('peak_reserved_bytes'))} | "
              f"{fmt_gib(pm.get('device_used_max_bytes'))} | {fmt_gib(rm.get('plan_peak_bytes'))} | {fmt_gib(rm.get('plan_device_arena_bytes'))} | "
              f"{fmt_gib(rm.get('arena_high_water_bytes'))} | {fmt_gib(rm.get('plan_device_total_bytes'))} | {fmt_gib(used)} | {ratio} |")
    print()
    print("Last train step's grad_norm, with a tiny learning rate. Inputs \"shared\": the peer started from rlpipe's "
          "random checkpoint and rollouts (fair_device.sh), so the two norms are of the same weights and data and "
          "differ by the two sides' bf16 arithmetic; \"own\": each side drew its own (HF's initialiser and torch.rand "
          "rewards, model.RandomTensors and rollout.Toy), so they agree only as two similar problems do. A difference "
          f"over {100 * GRAD_NORM_TOL_SHARED:g}% (shared) or {100 * GRAD_NORM_TOL:g}% (own) is marked DIFFERS: a speed-up "
          "over wrong grads is not one.\n")
    print("| model | offload | inputs | FSDP2 grad_norm | rlpipe grad_norm | difference | agree |")
    print("|---|---|---|---:|---:|---:|---|")
    for k in keys:
        peer, rl = by.get((k, "fsdp2")), by.get((k, "rlpipe"))
        a = get(peer, "last_metrics", "grad_norm")
        b = get(rl, "last_metrics", "grad_norm")
        shared = shared_inputs(peer, rl)
        ok = agree(a, b, GRAD_NORM_TOL_SHARED if shared else GRAD_NORM_TOL)
        diff = "—" if a is None or b is None else f"{100 * abs(a - b) / max(abs(a), abs(b)):.2f}%"
        inputs = "shared" if shared else "own"
        print(f"| {k[0]} | {'yes' if k[1] else 'no'} | {inputs} | {fmt_norm(a)} | {fmt_norm(b)} | {diff} | {ok} |")
        if ok == "DIFFERS":
            print(f"compare: {k[0]} offload={'yes' if k[1] else 'no'}: grad_norm {b:.5g} (rlpipe) against {a:.5g} (FSDP2)",
                  file=sys.stderr)
    print()
    print("Runs:")
    for r in sorted(rs, key=lambda r: (r["_model"], r["_offload"], r.get("impl", ""))):
        extra = ""
        if r.get("impl") == "rlpipe":
            extra = f", backend {r.get('backend')} ({r.get('device')}), setup {r.get('setup_s') or 0:.1f}s, checkpoint {r.get('checkpoint_s') or 0:.1f}s"
        else:
            extra = f", torch {r.get('torch')}, layout {(get(r, 'workload', 'layout') or '?').split(' ')[0]}, ac {get(r, 'workload', 'ac')}, compile {get(r, 'workload', 'compile') or 'none'}, setup {r.get('setup_s') or 0:.1f}s"
        n = len(get(r, "train", "times_s") or [])
        print(f"- {r.get('impl')} {r['_model']} offload={'yes' if r['_offload'] else 'no'}: {status(r)}; {n} timed train steps{extra} ({os.path.basename(r['_path'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
