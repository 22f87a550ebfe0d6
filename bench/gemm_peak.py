#!/usr/bin/env python3
"""The GPU's bf16 matrix-product rate on large square products (cuBLAS through PyTorch).

    python3 bench/gemm_peak.py [--sizes 8192,16384] [--iters 50] [--out peak.json]

For each size N it multiplies two N×N bf16 matrices drawn from a normal
distribution (random operands: constant ones draw less power and run
faster) with torch.matmul, three rounds of --iters products timed with
CUDA events after a warm-up, and prints each round's TFLOP/s (2·N³ FLOPs a
product). bench/bound.py takes the best as the rate a product can reach
on this GPU (--peak-tflops).
"""

import argparse
import json

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8192,16384")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(5):
            torch.matmul(a, b, out=c)
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.iters):
                torch.matmul(a, b, out=c)
            end.record()
            torch.cuda.synchronize()
            sec = start.elapsed_time(end) / 1e3 / args.iters
            rows.append({"n": n, "tflops": 2 * n ** 3 / sec / 1e12})
            print(f"{n}^3 bf16: {rows[-1]['tflops']:.0f} TFLOP/s")
    print(f"best: {max(r['tflops'] for r in rows):.0f} TFLOP/s on {torch.cuda.get_device_name()}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
