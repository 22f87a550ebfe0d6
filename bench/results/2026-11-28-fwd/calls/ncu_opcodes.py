#!/usr/bin/env python3
"""Share of Nsight Compute's warp-state samples by SASS opcode, per kernel
(the forward's figures in docs/performance.md's section "overlap_reduce by
default"):

    tar xzf call1/r.tgz && python3 calls/ncu_opcodes.py n/source.csv

source.csv is `ncu --import R --page source --csv --print-source sass`.
Stall reasons: ../../2026-11-28-long/calls/ncu_stalls.py on the same file.
"""
import collections
import csv
import io
import os
import sys

# blocks and num read source.csv as ncu_stalls.py does.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "2026-11-28-long", "calls"))
from ncu_stalls import blocks, num  # noqa: E402


def main(path, top=18):
    samp = "Warp Stall Sampling (All Samples)"
    for b in blocks(path):
        name = next(csv.reader([b[0]]))[1]
        rows = list(csv.reader(io.StringIO("\n".join(b[1:]))))
        hdr = rows[0]
        data = [r for r in rows[1:] if len(r) == len(hdr)]
        ix = {h: i for i, h in enumerate(hdr)}
        tot = sum(num(r, ix, samp) for r in data) or 1.0
        by, ex = collections.Counter(), collections.Counter()
        for r in data:
            words = r[ix["Source"]].split()
            op = (words[1] if words[0].startswith("@") else words[0]).split(".")[0]
            by[op] += num(r, ix, samp)
            ex[op] += num(r, ix, "Instructions Executed")
        print(f"## {name}: {int(tot)} samples")
        for op, v in by.most_common(top):
            print(f"  {op:12s} {v / tot * 100:5.1f}% of the samples, {ex[op]:.0f} warp instructions executed")


if __name__ == "__main__":
    main(sys.argv[1])
