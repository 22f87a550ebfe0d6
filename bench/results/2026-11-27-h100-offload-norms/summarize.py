"""Writes summary.md's tables from callN.tgz (run here: python3 summarize.py > summary.md)."""
import glob, json, os, re, statistics, tarfile, tempfile

# What each run's binary was, by call and file-name variant (README.md).
names = {
    1: {"new": "46de058: norms on c82f79c (racy)", "base": "c82f79c (racy Down stream)"},
    2: {"pre": "pre: 0d91554, before the Down stream", "fix": "fix: af3fd79", "norms": "norms: a039286"},
    3: {"resident": "norms: a039286, resident", "offload": "norms: a039286"},
}
tmp = tempfile.mkdtemp()
for c in names:
    with tarfile.open(f"call{c}.tgz") as t:
        t.extractall(os.path.join(tmp, f"c{c}"))
print("# Offloaded 3B (and resident, call 3), 8 x 2048 tokens, one H100 a call\n")
print("| call | run | build | train steps (s) | median | grad_norm |")
print("|---|---|---|---|---:|---:|")
pooled = {}
for c in sorted(names):
    for f in sorted(glob.glob(os.path.join(tmp, f"c{c}", "o", "*.json"))):
        base = os.path.basename(f)
        m = re.match(r"(?:off-)?([a-z]+)-(\d+)\.json$", base)
        if not m or m.group(1) not in names[c]:
            continue
        r = json.load(open(f))
        xs = r["train"]["times_s"]
        v = names[c][m.group(1)]
        pooled.setdefault((c, v), []).extend(xs)
        print(f"| {c} | {base} | {v} | {', '.join(f'{x:.3f}' for x in xs)} | {statistics.median(xs):.3f} | {r['last_metrics']['grad_norm']:.6g} |")
print("\n| call | build | steps | median train step | train tok/s |")
print("|---|---|---:|---:|---:|")
for (c, v), xs in pooled.items():
    m = statistics.median(xs)
    print(f"| {c} | {v} | {len(xs)} | {m:.3f} s | {16384 / m:,.0f} |")
print("\n| call | peer (offloaded, activation checkpointing) train tok/s |")
print("|---|---:|")
for c in sorted(names):
    p = os.path.join(tmp, f"c{c}", "o", "peer-ac.json")
    if os.path.exists(p):
        print(f"| {c} | {json.load(open(p))['train']['tokens_per_s']:,.0f} |")
