#!/usr/bin/env python3
"""PyTorch's NCCL collectives on the decoder layers of rlpipe's BenchmarkCollectives.

    torchrun --nproc_per_node N bench/nccl_peer.py [--iters 50] [--out peer-nccl.json]

For Qwen2.5-1.5B's and 3B's decoder layer (every parameter padded to a
multiple of N rows, as both FSDP2 and rlpipe shard them), it times on
each of the N GPUs the layer's float32 grads reduce-scattered (average)
and its bf16 params all-gathered: flat (one reduce_scatter_tensor or
all_gather_into_tensor on the whole layer, as FSDP2 issues them) and per
parameter (one call a parameter inside
torch.distributed._coalescing_manager, which issues them as one NCCL
group, as rlpipe's train stage does). Times are CUDA events around --iters
calls after three warm-up calls; bus bandwidth is what a rank moves,
(N-1)/N of the layer's bytes, over the time. Rank 0 prints a markdown
table and writes the rows as JSON to --out.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist

LAYERS = {
    # hidden, intermediate, heads, kv heads, head dim
    "1.5B": (1536, 8960, 12, 2, 128),
    "3B": (2048, 11008, 16, 2, 128),
}


def layer_shapes(hidden, inter, heads, kv, hd):
    """The [rows, cols] of a Qwen2 decoder layer's parameters."""
    q, k = heads * hd, kv * hd
    return [(hidden, 1), (q, hidden), (q, 1), (k, hidden), (k, 1), (k, hidden), (k, 1),
            (hidden, q), (hidden, 1), (inter, hidden), (inter, hidden), (hidden, inter)]


def padded(shapes, world):
    """Each parameter's element count, its rows padded to a multiple of world."""
    return [-(-r // world) * world * c for r, c in shapes]


def timed(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dist.barrier()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default="peer-nccl.json")
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda")
    rows = []
    for name, dims in LAYERS.items():
        sizes = padded(layer_shapes(*dims), world)
        total = sum(sizes)
        for dt, what in ((torch.float32, "reduce-scatter f32"), (torch.bfloat16, "all-gather bf16")):
            full = torch.randn(total, device=dev).to(dt)
            part = torch.empty(total // world, device=dev, dtype=dt)
            fulls = list(torch.split(full, sizes))
            parts = list(torch.split(part, [s // world for s in sizes]))
            if what.startswith("reduce"):
                def flat():
                    dist.reduce_scatter_tensor(part, full, op=dist.ReduceOp.AVG)

                def per():
                    with dist._coalescing_manager(async_ops=False):
                        for p, f in zip(parts, fulls):
                            dist.reduce_scatter_tensor(p, f, op=dist.ReduceOp.AVG)
            else:
                def flat():
                    dist.all_gather_into_tensor(full, part)

                def per():
                    with dist._coalescing_manager(async_ops=False):
                        for p, f in zip(parts, fulls):
                            dist.all_gather_into_tensor(f, p)
            for form, fn in (("flat", flat), ("per parameter", per)):
                sec = timed(fn, args.iters)
                moved = total * full.element_size() * (world - 1) / world
                rows.append({"layer": name, "op": f"{what} {form}", "ranks": world,
                             "us": sec * 1e6, "bus_gbs": moved / sec / 1e9})
    if rank == 0:
        print(f"| layer | op | ranks | µs | bus GB/s |\n|---|---|---:|---:|---:|")
        for r in rows:
            print(f"| {r['layer']} | {r['op']} | {r['ranks']} | {r['us']:.1f} | {r['bus_gbs']:.1f} |")
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                       "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
