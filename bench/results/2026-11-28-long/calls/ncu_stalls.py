#!/usr/bin/env python3
"""Summarise call 9's Nsight Compute samples (the figures of
docs/performance.md's "what bounds the dk/dv kernel" and "the change
kept").

    tar xzf call9/n.tgz && python3 calls/ncu_stalls.py n/source.csv

source.csv is `ncu --import R --page source --csv --print-source sass`:
one block of rows per kernel, each row a SASS instruction with its
warp-state samples (stall_* columns) and execution counts. For each
kernel it prints the share of the samples per stall reason, the most
sampled instructions with the one before them (so that a WARPGROUP.DEPBAR
shows which HGMMA it waits for), the local-memory instructions and their
execution counts, and the execution counts of the BSSY instructions and
of the instructions just after their branch (the masked path of the dS
step: executed in a fraction of the tiles).
"""
import collections
import csv
import io
import sys


def blocks(path):
    cur = None
    for ln in open(path).read().split("\n"):
        if ln.startswith('"Kernel Name"'):
            if cur:
                yield cur
            cur = [ln]
        elif cur is not None:
            cur.append(ln)
    if cur:
        yield cur


def num(r, ix, k):
    try:
        return float(r[ix[k]].replace(",", "") or 0)
    except (KeyError, ValueError):
        return 0.0


def main(path, top=8):
    for b in blocks(path):
        name = next(csv.reader([b[0]]))[1]
        rows = list(csv.reader(io.StringIO("\n".join(b[1:]))))
        hdr = rows[0]
        data = [r for r in rows[1:] if len(r) == len(hdr)]
        ix = {h: i for i, h in enumerate(hdr)}
        samp = "Warp Stall Sampling (All Samples)"
        tot = sum(num(r, ix, samp) for r in data) or 1.0
        print(f"## {name}: {int(tot)} samples, {len(data)} instructions")
        stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
        share = sorted(((sum(num(r, ix, s) for r in data) / tot * 100, s) for s in stalls), reverse=True)
        print("stalls, % of samples: " + ", ".join(f"{s[6:]} {v:.1f}" for v, s in share if v >= 1))
        order = sorted(range(len(data)), key=lambda i: -num(data[i], ix, samp))[:top]
        for i in order:
            r, prev = data[i], data[i - 1] if i else None
            p = f"  (after {prev[ix['Source']].strip()[:40]})" if prev else ""
            print(f"  {num(r, ix, samp) / tot * 100:5.2f}%  {r[ix['Source']].strip()[:50]}{p}")
        loc = [r for r in data if "LDL" in r[ix["Source"]] or "STL" in r[ix["Source"]]]
        print(f"local-memory instructions: {len(loc)}, executed " +
              ", ".join(str(int(num(r, ix, 'Instructions Executed'))) for r in loc))
        ex = collections.Counter()
        for i, r in enumerate(data):
            if "BSSY" in r[ix["Source"]] and i + 3 < len(data):
                # BSSY, a default, the branch, then the masked path's first instruction
                ex[(int(num(r, ix, "Instructions Executed")), int(num(data[i + 3], ix, "Instructions Executed")))] += 1
        for (a, m), n in ex.most_common(3):
            print(f"BSSY executed {a}, the instruction after its branch {m} ({m / a * 100 if a else 0:.0f}%): {n} times")
        print()


if __name__ == "__main__":
    main(sys.argv[1])
