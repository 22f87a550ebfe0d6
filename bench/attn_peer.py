#!/usr/bin/env python3
"""PyTorch's causal attention on the shapes of rlpipe's BenchmarkAttention.

    python3 bench/attn_peer.py [--shapes "8x2048/16/2/128 ..."] [--iters 20] [--out peer-attn.json]

Each shape SEQSxN/HQ/HKV/D is a batch of SEQS sequences of N tokens, HQ
query and HKV kv heads of head dim D, bf16, as [SEQS, heads, N, D]
tensors with q, k, v and the output's gradient drawn from a normal
distribution. For PyTorch's own choice of backend (default: what
transformers' SDPA attention gets) and each of
torch.nn.functional.scaled_dot_product_attention's backends that takes the
shape (flash, cudnn, efficient; chosen with
torch.nn.attention.sdpa_kernel), and for each way of giving it the kv heads
(gqa: enable_gqa=True, the kv heads as they are; repeat: k and v repeated
to HQ heads before the timed region, as transformers' repeat_kv does
inside its layer, which leaves the kernel its best case), it times the
forward alone and the forward with its backward (torch.autograd.grad of
q, k and v), with CUDA events around --iters runs after two warm-up runs;
the backward is the difference. TFLOP/s use FlashAttention's count for
causal attention, as rlpipe's benchmark does: 4·N(N+1)/2·D·HQ per
sequence for the forward, 2.5 times that for the backward.

Prints a markdown table and writes the rows as JSON to --out. A backend
that rejects a shape is listed with its error, not timed.
"""

import argparse
import contextlib
import json
import sys


def parse_shapes(text):
    """[(seqs, n, hq, hkv, d)] from "SEQSxN/HQ/HKV/D ..."."""
    out = []
    for f in text.split():
        try:
            sn, hq, hkv, d = f.split("/")
            seqs, n = sn.split("x")
            vals = tuple(int(x) for x in (seqs, n, hq, hkv, d))
        except ValueError:
            raise ValueError(f"attention shape {f!r}: want SEQSxN/HQ/HKV/D") from None
        if min(vals) <= 0 or vals[2] % vals[3]:
            raise ValueError(f"attention shape {f!r}: positive sizes, HQ a multiple of HKV")
        out.append(vals)
    return out


def fwd_flops(seqs, n, hq, d):
    return seqs * 2 * 2 * n * (n + 1) / 2 * d * hq


def time_case(torch, F, backend, gqa, shape, iters):
    seqs, n, hq, hkv, d = shape
    from torch.nn.attention import sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(0)
    kvh = hkv if gqa else hq

    def mk(h):
        return torch.randn(seqs, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()

    q, k, v = mk(hq), mk(hkv), mk(hkv)
    if not gqa:
        k = k.detach().repeat_interleave(hq // hkv, dim=1).requires_grad_()
        v = v.detach().repeat_interleave(hq // hkv, dim=1).requires_grad_()
    assert k.shape[1] == kvh
    dout = torch.randn(seqs, hq, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
    kw = {"is_causal": True}
    if gqa:
        kw["enable_gqa"] = True

    def fwd():
        return F.scaled_dot_product_attention(q, k, v, **kw)

    def both():
        o = fwd()
        return torch.autograd.grad(o, (q, k, v), dout)

    def timed(f):
        with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
            for _ in range(2):
                f()
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(iters):
                f()
            b.record()
            torch.cuda.synchronize()
            return a.elapsed_time(b) / 1e3 / iters

    with torch.no_grad():
        t_fwd = timed(fwd)
    t_both = timed(both)
    return t_fwd, t_both - t_fwd


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="8x2048/16/2/128 2x8192/16/2/128 1x16384/16/2/128 8x2048/12/2/128 8x2048/14/2/64")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    shapes = parse_shapes(args.shapes)

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    backends = [("default", None), ("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    rows = []
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| shape | backend | kv heads | fwd µs | fwd TFLOP/s | bwd µs | bwd TFLOP/s |")
    print("|---|---|---|---:|---:|---:|---:|")
    for shape in shapes:
        seqs, n, hq, hkv, d = shape
        name = f"{seqs}x{n} h{hq}/{hkv} d{d}"
        ff = fwd_flops(seqs, n, hq, d)
        for bname, backend in backends:
            for gqa in (True, False):
                row = {"shape": name, "backend": bname, "kv": "gqa" if gqa else "repeat"}
                try:
                    tf, tb = time_case(torch, F, backend, gqa, shape, args.iters)
                except Exception as e:  # a backend that does not take the shape
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                    print(f"| {name} | {bname} | {row['kv']} | {row['error']} | | | |")
                    torch.cuda.synchronize()
                    rows.append(row)
                    continue
                row.update({"fwd_s": tf, "bwd_s": tb, "fwd_tflops": ff / tf / 1e12, "bwd_tflops": 2.5 * ff / tb / 1e12})
                rows.append(row)
                print(f"| {name} | {bname} | {row['kv']} | {tf * 1e6:.1f} | {row['fwd_tflops']:.0f} | "
                      f"{tb * 1e6:.1f} | {row['bwd_tflops']:.0f} |")
                sys.stdout.flush()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
