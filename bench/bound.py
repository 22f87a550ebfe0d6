#!/usr/bin/env python3
"""What a stage's time is made of, and how fast it could be at best.

    python3 bench/bound.py RLPIPE.json TRACE.json PEER.json... [--peak-tflops F | --peak-json P] [--target 1.5]

RLPIPE.json and TRACE.json are what one `rlbench --out R.json --timeline
T.json` run writes (rank 0's last step); PEER.json are peer_fsdp2.py
results of the same model in the same call (their best tok/s per stage is
taken). For the ref_logprob and train stages it splits the compute
stream's ops (as bench/trace_ops.py sums them) into

- the matrix products of the decoder layers (qkv, o_proj, gate_up, down,
  forward and backward: 2·tokens·in·out FLOPs a product, the backward two
  products) and of the log-prob head (2·rows·hidden·vocab a product, the
  rows being the response tokens; the train stage's head runs three),
- attention (FlashAttention's causal count, 4·N(N+1)/2·head_dim·heads a
  sequence of N tokens forward, 2.5 times that backward),
- everything else (norms, casts, gathers' waits, the optimizer),

with each part's time and rate, and prints the stage's time under three
bounds: the products and attention at their measured rates with the rest
free; the products at --peak-tflops (a square product's rate measured in
the same call) with the rest as measured; and the products at that rate
with the rest free. Against each it prints the ratio to the peer that
time would give, beside --target (issue 11's 1.5).
"""

import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_ops  # noqa: E402


def layer_flops(m, tokens):
    """FLOPs of one decoder layer's forward products, by op name."""
    h, inter, heads, kv = m["hidden"], m["intermediate"], m["heads"], m["kv_heads"]
    hd = h // heads
    q, k = heads * hd, kv * hd
    return {"qkv": 2 * tokens * h * (q + 2 * k), "o_proj": 2 * tokens * q * h,
            "gate_up": 2 * tokens * h * 2 * inter, "down": 2 * tokens * inter * h}


def attention_flops(m, seqs, n):
    """FlashAttention's forward FLOPs of one layer over seqs sequences of n tokens."""
    hd = m["hidden"] // m["heads"]
    return seqs * 4 * n * (n + 1) // 2 * hd * m["heads"]


def parts(r, spans):
    """[(part, kind, ms, flops)] of a stage's compute spans; kind is
    product, attention or other."""
    m, w = r["model"], r["workload"]
    dp = w.get("dp") or 1
    tokens = w["tokens_per_step"] // dp
    rows = w["response_tokens_per_step"] // dp
    seqs = w["seqs"] // dp
    lf = layer_flops(m, tokens)
    af = attention_flops(m, seqs, w["tokens_per_seq"])
    head = 2 * rows * m["hidden"] * m["vocab"]
    out = []
    for k, (us, n) in sorted(trace_ops.op_sums(spans).items(), key=lambda kv: -kv[1][0]):
        ms = us / 1e3
        base = k.removesuffix(" backward")
        if base in lf:
            out.append((k, "product", ms, n * lf[base] * (2 if k != base else 1)))
        elif k == "attention":
            out.append((k, "attention", ms, n * af))
        elif k == "attention backward":
            out.append((k, "attention", ms, n * af * 5 // 2))
        elif k == "head forward-backward":
            out.append((k, "product", ms, 3 * head))
        elif k == "head log-prob chunks":
            out.append((k, "product", ms, head))
        else:
            out.append((k, "other", ms, 0))
    return out


def best(peers, stage):
    """The peers' fastest tok/s in stage (runs that failed have none)."""
    v = [(p.get(stage) or {}).get("tokens_per_s") or 0 for p in peers]
    return max(v) if v and max(v) > 0 else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rlpipe")
    ap.add_argument("trace")
    ap.add_argument("peers", nargs="*")
    ap.add_argument("--peak-tflops", type=float, default=0, help="a square bf16 product's rate in the same call")
    ap.add_argument("--peak-json", default="", help="instead, bench/gemm_peak.py's --out file: its best round")
    ap.add_argument("--target", type=float, default=1.5)
    args = ap.parse_args(argv)
    if args.peak_json:
        with open(args.peak_json) as f:
            args.peak_tflops = max(r["tflops"] for r in json.load(f)["rows"])
    with open(args.rlpipe) as f:
        r = json.load(f)
    with open(args.trace) as f:
        t = json.load(f)
    peers = []
    for p in args.peers:
        with open(p) as f:
            peers.append(json.load(f))
    events = t["traceEvents"] if isinstance(t, dict) else t
    dp = r["workload"].get("dp") or 1
    for stage, key in (("ref_logprob", "ref_logp"), ("train", "train")):
        spans = trace_ops.groups(events, "").get(key)
        if not spans:
            continue
        ps = parts(r, spans)
        span = (spans[-1]["ts"] + spans[-1]["dur"] - spans[0]["ts"]) / 1e3
        tokens = r["workload"]["tokens_per_step"] // dp
        print(f"## {r['model'].get('config', '?')} {stage}: {tokens} tokens a GPU, span {span:.1f} ms "
              f"(median stage time {1e3 * r[stage]['median_s']:.1f} ms)\n")
        print("| op | kind | ms | TFLOP | TFLOP/s |")
        print("|---|---|---:|---:|---:|")
        tot = collections.defaultdict(lambda: [0.0, 0.0])
        for k, kind, ms, fl in ps:
            rate = f"{fl / ms / 1e9:.0f}" if fl else ""
            print(f"| {k} | {kind} | {ms:.2f} | {fl / 1e12:.2f} | {rate} |")
            tot[kind][0] += ms
            tot[kind][1] += fl
        for kind in ("product", "attention", "other"):
            ms, fl = tot[kind]
            rate = f"{fl / ms / 1e9:.0f}" if fl and ms else ""
            print(f"| **all {kind}s** | | {ms:.2f} | {fl / 1e12:.2f} | {rate} |")
        pm, pf = tot["product"]
        am, om = tot["attention"][0], tot["other"][0]
        peer = best(peers, stage)
        goal = tokens / (args.target * peer) * 1e3 if peer else None
        print()
        if peer:
            print(f"peer's best {peer:,.0f} tok/s a GPU: {tokens / peer * 1e3:.1f} ms; {args.target}× it: {goal:.1f} ms\n")
        rows = [("as measured", pm + am + om), ("the rest free", pm + am)]
        if args.peak_tflops:
            at = pf / args.peak_tflops / 1e9
            rows += [(f"products at {args.peak_tflops:.0f} TFLOP/s", at + am + om),
                     (f"products at {args.peak_tflops:.0f} TFLOP/s, the rest free", at + am)]
        print("| bound | ms | ratio to the peer |")
        print("|---|---:|---:|")
        for name, ms in rows:
            ratio = f"{tokens / peer * 1e3 / ms:.2f}×" if peer else "—"
            print(f"| {name} | {ms:.1f} | {ratio} |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
