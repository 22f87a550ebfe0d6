#!/usr/bin/env bash
# rlpipe's causal attention against PyTorch's, kernel against kernel, in
# one device call: gpu/cuda's BenchmarkAttention (the forward and backward
# that Backend.Attention and AttentionBackward run on this GPU) and
# bench/attn_peer.py (scaled_dot_product_attention's flash, cudnn and
# efficient backends, the kv heads as they are and repeated, and its
# default choice) on the same shapes, then a table of each shape's rlpipe
# times (the forward and the backward) against the fastest PyTorch backend's. Build first:
#
#   go test -c -o .devbin/cuda.test ./gpu/cuda
#
# Knobs: ATTN_SHAPES (SEQSxN/HQ/HKV/D separated by spaces; the
# benchmark's defaults: 16384 tokens as 8, 2 and 1 sequences at the 3B's
# heads, and 8 × 2048 at the 1.5B's and 0.5B's), ATTN_ITERS (20),
# ATTN_BUDGET_S (300). $OUT gets summary.txt, table.md, peer-attn.json and
# the logs.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/attn-peer-out}
SHAPES=${ATTN_SHAPES:-"8x2048/16/2/128 2x8192/16/2/128 1x16384/16/2/128 8x2048/12/2/128 8x2048/14/2/64"}
ITERS=${ATTN_ITERS:-20}
BUDGET=${ATTN_BUDGET_S:-300}
. bench/device_lib.sh # outdirs, say, budgeted
outdirs
say "start: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1); shapes: $SHAPES"
say "$(cd gpu/cuda && RLPIPE_BENCH_ATTN="$SHAPES" budgeted rlpipe-attn 150 "$B/cuda.test" -test.run '^$' \
	-test.bench '^BenchmarkAttention$' -test.benchtime "${ITERS}x")"
say "$(budgeted peer-attn 150 python3 bench/attn_peer.py --shapes "$SHAPES" --iters "$ITERS" --out "$OUT/peer-attn.json")"
python3 - "$OUT/logs/rlpipe-attn.log" "$OUT/peer-attn.json" >"$OUT/table.md" 2>&1 <<'PY'
import json, re, sys
ours = {}
for line in open(sys.argv[1]):
    m = re.match(r"BenchmarkAttention/(fwd|bwd)_(\d+x\d+)_h(\d+)/(\d+)_d(\d+)-\d+\s+\d+\s+(\d+) ns/op", line)
    if m:
        ours[(m[2] + f" h{m[3]}/{m[4]} d{m[5]}", m[1].replace("_", " "))] = int(m[6]) / 1e9
try:
    peer = json.load(open(sys.argv[2]))["rows"]
except (OSError, ValueError) as e:
    peer = []
    print(f"no peer results: {e}")
print("| shape | pass | rlpipe µs | PyTorch's fastest (backend, kv heads) µs | rlpipe / PyTorch speed |")
print("|---|---|---:|---|---:|")
for (shape, p), t in ours.items():
    key = "fwd_s" if p == "fwd" else "bwd_s"
    best = min((r for r in peer if r["shape"] == shape and key in r), key=lambda r: r[key], default=None)
    if best is None:
        print(f"| {shape} | {p} | {t * 1e6:.1f} | none | |")
        continue
    tp = best[key]
    print(f"| {shape} | {p} | {t * 1e6:.1f} | {tp * 1e6:.1f} ({best['backend']}, {best['kv']}) | {tp / t:.2f}× |")
PY
cat "$OUT/table.md" | tee -a "$OUT/summary.txt"
grep -h '^|' "$OUT/logs/peer-attn.log" >>"$OUT/summary.txt"
