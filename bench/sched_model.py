#!/usr/bin/env python3
"""List-scheduling model of the wgmma attention kernels' block order.

Each CTA's time is taken as proportional to the tiles its block works
through (causal: a query block sees the keys from its sequence's start to
its last row, a key block the queries from its first key to its sequence's
end); CTAs start in the given order on the first free slot (an SM times the
CTAs it holds at once). It prints the time of the last CTA to finish for the
index order the kernels used before k_attn_order, for the heaviest-first
order it writes, and the ideal (the total over the slots), in units of one
tile. The figures quoted in gpu/cuda/kernels/attention.cu and
docs/performance.md: python3 bench/sched_model.py (8 sequences of 2048
tokens, Qwen2.5-1.5B's 12 query and 2 key/value heads, 132 SMs).
"""
import argparse
import heapq


def finish(works, slots):
    free = [0.0] * slots
    for w in works:
        t = heapq.heappop(free)
        heapq.heappush(free, t + w)
    return max(free)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--len", type=int, default=2048)
    ap.add_argument("--hq", type=int, default=12)
    ap.add_argument("--hkv", type=int, default=2)
    ap.add_argument("--sms", type=int, default=132)
    a = ap.parse_args()
    t = a.seqs * a.len

    def qwork(b, rows):  # tiles of `rows` keys the query block b sees
        return ((b * rows) % a.len + rows) / rows

    def kwork(b, rows):  # tiles of `rows` queries that see key block b
        return (a.len - (b * rows) % a.len) / rows

    kernels = [
        # name, work per block, blocks, heads, CTAs an SM, index order before
        ("forward (128-row blocks, 1 CTA/SM)", lambda b: qwork(b, 128), t // 128, a.hq, 1, "reversed"),
        ("dq pass (64-row blocks, 3 CTAs/SM)", lambda b: qwork(b, 64), t // 64, a.hq, 3, "reversed"),
        ("dk/dv pass (128-key blocks, 1 CTA/SM)", lambda b: kwork(b, 128), t // 128, a.hkv, 1, "index"),
    ]
    for name, work, nb, heads, occ, before in kernels:
        blocks = list(range(nb))
        if before == "reversed":
            blocks.reverse()
        # before: grid x = block, y = head, dispatched x fastest
        old = [work(b) for _ in range(heads) for b in blocks]
        # k_attn_order: blocks by decreasing work, every head of a block together
        new = [work(b) for b in sorted(range(nb), key=lambda b: (-work(b), b)) for _ in range(heads)]
        slots = a.sms * occ
        print(f"{name}: index order {finish(old, slots):.1f}, heaviest first {finish(new, slots):.1f}, ideal {sum(old) / slots:.1f}")


if __name__ == "__main__":
    main()
