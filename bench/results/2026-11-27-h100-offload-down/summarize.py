"""Writes summary.md's tables from callN.tgz (run here: python3 summarize.py)."""
import glob, json, os, statistics, tarfile, tempfile

# What the "new" runs' binary was in each call (README.md).
names = {2: {"base": "base", "new": "down"}, 3: {"base": "base", "new": "down+norms(15 threads)"},
         4: {"base": "base", "down": "down", "new": "down+norms(4 threads)"},
         5: {"base": "base", "down": "down", "new": "down+norms(4 threads)"},
         6: {"base": "base", "new": "down"}}
tmp = tempfile.mkdtemp()
for c in names:
    with tarfile.open(f"call{c}.tgz") as t:
        t.extractall(os.path.join(tmp, f"c{c}"))
rows = {}
print("| call | run | variant | ref_logprob s | train s | train tok/s |")
print("|---|---|---|---:|---:|---:|")
for c in sorted(names):
    for f in sorted(glob.glob(os.path.join(tmp, f"c{c}", "o", "off-*.json"))):
        r, base = json.load(open(f)), os.path.basename(f)
        if r.get("status", "ok") != "ok" or not r["train"].get("median_s"):
            print(f"| {c} | {base} | failed | | | |")
            continue
        v = base[4:-5].rsplit("-", 1)[0] if base.count("-") > 1 else base[4:-5]
        v = names[c].get(v, v)
        a, b = r["ref_logprob"]["median_s"], r["train"]["median_s"]
        rows.setdefault(v, []).append(b)
        print(f"| {c} | {base} | {v} | {a:.3f} | {b:.3f} | {16384 / b:,.0f} |")
print("\n| variant | runs | median train s | tok/s | vs base |")
print("|---|---:|---:|---:|---:|")
ref = statistics.median(rows["base"])
for v, xs in rows.items():
    m = statistics.median(xs)
    print(f"| {v} | {len(xs)} | {m:.3f} | {16384 / m:,.0f} | {ref / m:.3f}x |")
