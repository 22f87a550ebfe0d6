# Counts the SASS instructions of k_gemm_dswiglu_bf16's epilogue from a
# `cuobjdump -sass` listing (calls 2 and 3, r.tgz: ops/sass/b0.sass,
# ops/new.sass): argv[1] the listing, then address ranges lo-hi (hex,
# hi excluded) that together make one vector's path. It prints the count
# and the opcodes by frequency. The ranges used in docs/performance.md:
#   b0:  4-vector loop body 47e0-5d40, less its eight NaN blocks (each a
#        predicated branch over about 9 instructions, not taken);
#   new: 4d90-5990 and 6380-6430 (the fast path, then the stores).
import collections, re, sys
ins = []
for line in open(sys.argv[1]):
    m = re.match(r'\s+/\*([0-9a-f]{4,})\*/\s+(.*?);', line)
    if m:
        ins.append((int(m.group(1), 16), m.group(2).strip()))
sel = []
for r in sys.argv[2:]:
    lo, hi = (int(x, 16) for x in r.split('-'))
    sel += [t for a, t in ins if lo <= a < hi]
ops = collections.Counter(t.split()[1 if t.startswith('@') else 0].split('.')[0] for t in sel)
print(len(sel), 'instructions')
for op, n in ops.most_common():
    print(f'{n:5d} {op}')
