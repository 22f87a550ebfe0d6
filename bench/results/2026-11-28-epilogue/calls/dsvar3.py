# Writes a diagnostic form of gpu/cuda/kernels/gemm.cu's k_gemm_dswiglu
# (the form whose g and u chunks the TMA copies into shared memory) to
# stdout: nocomp replaces SwiGLU's backward with bit operations on the
# same words (same loads, waits and stores); nowait skips the wait for a
# chunk's copies (reads whatever the buffer holds); nostore skips the
# stores at run time.
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
if v == 'nocomp':
    i0 = k.index('#pragma unroll\n            for (int p = 0; p < 4; p++) {')
    i1 = k.index('            *(uint4*)(du + at)')
    k = k[:i0] + '            for (int p = 0; p < 4; p++) {\n              og[p] = gw[p] ^ dw4[p];\n              ou[p] = uw[p] ^ dw4[p];\n            }\n' + k[i1:]
if v == 'nowait':
    rep('          mb_wait(cfull + 8 * b, (cc / DS_NB) & 1);\n', '')
if v == 'nostore':
    rep('*(uint4*)(du + at) = make_uint4(ou[0], ou[1], ou[2], ou[3]);', 'if (m < 0) *(uint4*)(du + at) = make_uint4(ou[0], ou[1], ou[2], ou[3]);')
    rep('*(uint4*)(dg + at) = make_uint4(og[0], og[1], og[2], og[3]);', 'if (m < 0) *(uint4*)(dg + at) = make_uint4(og[0], og[1], og[2], og[3]);')
sys.stdout.write(s[:a] + k + s[b:])
