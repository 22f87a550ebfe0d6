#!/usr/bin/env python3
"""Sum a step's compute-stream op spans by kind, from rlbench's Chrome trace.

    python3 bench/trace_ops.py TRACE.json [--split-after NAME] [--top N]

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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--split-after", default="", help="the op that ends the first group (traces without stages)")
    ap.add_argument("--top", type=int, default=20, help="op kinds to list per group")
    args = ap.parse_args(argv)
    with open(args.trace) as f:
        t = json.load(f)
    events = t["traceEvents"] if isinstance(t, dict) else t
    for key, spans in groups(events, args.split_after).items():
        start, end = spans[0]["ts"], spans[-1]["ts"] + spans[-1]["dur"]
        busy = sum(e["dur"] for e in spans)
        gaps = sum(max(0.0, b["ts"] - (a["ts"] + a["dur"])) for a, b in zip(spans, spans[1:]))
        print(f"## {key}: span {(end - start) / 1e3:.1f} ms, ops busy {busy / 1e3:.1f} ms, gaps {gaps / 1e3:.1f} ms\n")
        by = collections.defaultdict(lambda: [0.0, 0])
        for e in spans:
            k = LAYER.sub("", e["name"]).strip()
            by[k][0] += e["dur"]
            by[k][1] += 1
        print("| op | spans | ms |")
        print("|---|---:|---:|")
        for k, (d, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[: args.top]:
            print(f"| {k} | {n} | {d / 1e3:.2f} |")
        print()
        for tid, (d, n) in sorted(others(events, start, end).items()):
            print(f"{tid}: {n} spans, {d / 1e3:.2f} ms")
        print()
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
