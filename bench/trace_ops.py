#!/usr/bin/env python3
"""Sum a step's compute-stream op spans by kind, from rlbench's Chrome trace.

    python3 bench/trace_ops.py TRACE.json [--split-after NAME] [--top N]
    python3 bench/trace_ops.py TRACE.json --backward STAGE

TRACE.json is what `rlbench --timeline TRACE.json` writes: rank 0's last
step, a span per op on each stream. Each compute span runs from its op's
mark to the next op's, so waits for other streams inside it count. Op
kinds drop the layer index ("layer7 gate_up" is "gate_up"). Spans are
grouped by their stage (args.stage); --split-after NAME puts the spans up
to the first span named NAME in one group ("before") and the rest in
another ("after"), for traces written before spans carried their stage. For each group it
prints the span from its first op's start to its last op's end, the time
the ops were busy, the gaps between them, and a markdown table of the op
kinds, largest first; then, for every other stream ("side", "compute
wait"), the count and total of its spans that start within the group's
span.
"""

import argparse
import collections
import json
import re
import statistics
import sys

LAYER = re.compile(r"\blayer\d+\b ?")


def groups(events, split_after):
    comp = sorted((e for e in events if e.get("ph") == "X" and e.get("tid") == "compute"), key=lambda e: e["ts"])
    out = collections.OrderedDict()
    after = False
    for e in comp:
        if split_after:
            key = "after" if after else "before"
        else:
            key = (e.get("args") or {}).get("stage", "step")
        out.setdefault(key, []).append(e)
        if split_after and e["name"] == split_after:
            after = True
    return out


def op_sums(spans):
    """{op kind: [µs, spans]} of spans, the layer index dropped from each
    name ("layer7 gate_up" is "gate_up")."""
    by = collections.defaultdict(lambda: [0.0, 0])
    for e in spans:
        k = LAYER.sub("", e["name"]).strip()
        by[k][0] += e["dur"]
        by[k][1] += 1
    return by


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--split-after", default="", help="the op that ends the first group (traces without stages)")
    ap.add_argument("--top", type=int, default=20, help="op kinds to list per group")
    ap.add_argument("--backward", metavar="STAGE", default="",
                    help="instead, per micro-batch of STAGE (a train stage): the median over the decoder layers of a layer's backward, of its gather for the backward (side stream) and of its grads' copy to the host (Down stream), in ms")
    args = ap.parse_args(argv)
    with open(args.trace) as f:
        t = json.load(f)
    events = t["traceEvents"] if isinstance(t, dict) else t
    if args.backward:
        return backward_medians(events, args.backward)
    for key, spans in groups(events, args.split_after).items():
        start, end = spans[0]["ts"], spans[-1]["ts"] + spans[-1]["dur"]
        busy = sum(e["dur"] for e in spans)
        gaps = sum(max(0.0, b["ts"] - (a["ts"] + a["dur"])) for a, b in zip(spans, spans[1:]))
        print(f"## {key}: span {(end - start) / 1e3:.1f} ms, ops busy {busy / 1e3:.1f} ms, gaps {gaps / 1e3:.1f} ms\n")
        by = op_sums(spans)
        print("| op | spans | ms |")
        print("|---|---:|---:|")
        for k, (d, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[: args.top]:
            print(f"| {k} | {n} | {d / 1e3:.2f} |")
        print()
        for tid, (d, n) in sorted(others(events, start, end).items()):
            print(f"{tid}: {n} spans, {d / 1e3:.2f} ms")
        print()
    return 0


def backward_medians(events, stage):
    """Print, per micro-batch of stage (each starts at a head op), the
    medians of the layers' backward period and of their side and Down
    stream spans."""
    spans = [e for e in events if e.get("ph") == "X"]
    comp = sorted((e for e in spans if e.get("tid") == "compute" and (e.get("args") or {}).get("stage") == stage),
                  key=lambda e: e["ts"])
    heads = [e["ts"] for e in comp if e["name"] in ("head forward-backward", "head backward")]
    if not heads:
        print(f"no head op in stage {stage!r}", file=sys.stderr)
        return 1
    bounds = heads + [float("inf")]
    print("| micro-batch | layer backward, ms | gather for backward, ms | grads to host, ms |")
    print("|---:|---:|---:|---:|")
    for k in range(len(heads)):
        lo, hi = bounds[k], bounds[k + 1]
        starts = [e["ts"] for e in comp if lo < e["ts"] < hi and e["name"].endswith("down backward")]
        period = [(b - a) / 1e3 for a, b in zip(starts, starts[1:])]
        side = [e["dur"] / 1e3 for e in spans if e.get("tid") == "side" and lo < e["ts"] < hi
                and LAYER.search(e["name"]) and e["name"].endswith("for backward")]
        down = [e["dur"] / 1e3 for e in spans if e.get("tid") == "down" and lo < e["ts"] < hi and LAYER.search(e["name"])]
        med = lambda v: f"{statistics.median(v):.1f}" if v else "-"
        print(f"| {k + 1} | {med(period)} | {med(side)} | {med(down)} |")
    return 0


def others(events, start, end):
    """Per stream other than the compute stream, the total duration and
    count of its spans that start in [start, end)."""
    out = collections.defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("ph") == "X" and e.get("tid") != "compute" and start <= e["ts"] < end:
            out[e["tid"]][0] += e["dur"]
            out[e["tid"]][1] += 1
    return out


if __name__ == "__main__":
    sys.exit(main())
