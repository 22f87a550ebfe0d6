# Writes a diagnostic variant of gpu/cuda/kernels/gemm.cu's k_gemm_dswiglu
# epilogue to stdout: none (the real kernel), noepi (no prefetch, loads,
# arithmetic or stores: the epilogue waits for the staged tile and releases
# it), noload (g and u taken from the staging tile instead of global
# memory, no prefetch), nostore (the stores skipped at run time), nopf
# (no L2 prefetch).
import sys
v = sys.argv[1]
s = open(sys.argv[2]).read()
a = s.index('__device__ __forceinline__ void gemm_dswiglu(')
b = s.index('extern "C" __global__ void __launch_bounds__(512, 1) k_gemm_dswiglu_bf16')
k = s[a:b]
def rep(old, new):
    global k
    assert k.count(old) == 1, old
    k = k.replace(old, new)
pf_start = k.index('        u32 bytes = (u32)min(DS_BN, n - n0) * 2;')
pf_end = k.index('        mb_wait(staged, i & 1);')
if v in ('noepi', 'noload', 'nopf'):
    k = k[:pf_start] + k[pf_end:]
if v == 'noepi':
    x0 = k.index('        for (int q = e; q < GS_BM * 24; q += 2 * DS_EPI) {')
    x1 = k.index('        warp_arrive(drained);')
    k = k[:x0] + k[x1:]
if v == 'noload':
    rep('gv[h2] = *(const uint4*)(g + at);', 'gv[h2] = *(const uint4*)(gstage + row * GS_ROW + (qq - row * 24) * 16);')
    rep('uv[h2] = *(const uint4*)(u + at);', 'uv[h2] = gv[h2];')
if v == 'nostore':
    rep('*(uint4*)(du + at) = make_uint4(ou[0], ou[1], ou[2], ou[3]);', 'if (m < 0) *(uint4*)(du + at) = make_uint4(ou[0], ou[1], ou[2], ou[3]);')
    rep('*(uint4*)(dg + at) = make_uint4(og[0], og[1], og[2], og[3]);', 'if (m < 0) *(uint4*)(dg + at) = make_uint4(og[0], og[1], og[2], og[3]);')
sys.stdout.write(s[:a] + k + s[b:])
