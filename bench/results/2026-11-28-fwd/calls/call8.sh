#!/usr/bin/env bash
# Call 8 (one H200): what this machine's NCCL offers for zero-CTA
# (copy-engine) collectives: the version and nccl.h's CTA policies and
# window registration, the library's symbols.
set -u
{
	python3 - <<'PY'
import glob, os
import nvidia.nccl as n
root = list(n.__path__)[0]
print("nvidia.nccl at", root)
for h in glob.glob(os.path.join(root, "**", "nccl.h"), recursive=True):
    print("header", h)
    for ln in open(h):
        if any(k in ln for k in ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH", "CTA_POLICY", "WindowRegister", "NCCL_WIN_", "ncclMemAlloc", "CTAPolicy")):
            print("   ", ln.rstrip())
for so in glob.glob(os.path.join(root, "**", "libnccl.so*"), recursive=True):
    print("lib", so)
PY
	for so in $(python3 -c 'import nvidia.nccl as n, glob, os; print(" ".join(glob.glob(os.path.join(list(n.__path__)[0], "**", "libnccl.so*"), recursive=True)))'); do
		nm -D "$so" 2>/dev/null | grep -E 'ncclCommWindowRegister|ncclMemAlloc|ncclCommInitRankConfig' | head
	done
	ldconfig -p | grep -i nccl | head
} >"$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
