# Writes a form of gpu/cuda/kernels/gemm.cu's k_gemm_dswiglu epilogue to
# stdout. pipe: each pair of vectors' g and u loads are issued before the
# pair before it is computed (registers for two pairs).
import sys
v = sys.argv[1]
# argv[3], if given: the consumers' and the other warps' registers, C,E.
s = open(sys.argv[2]).read()
a = s.index('__device__ __forceinline__ void gemm_dswiglu(')
b = s.index('extern "C" __global__ void __launch_bounds__(512, 1) k_gemm_dswiglu_bf16')
k = s[a:b]
def rep(old, new):
    global k
    assert k.count(old) == 1, old
    k = k.replace(old, new)
if v == 'pipe':
    i0 = k.index('        for (int q = e; q < GS_BM * 24; q += 2 * DS_EPI) {\n          uint4 gv[2], uv[2];')
    i1 = k.index('#pragma unroll\n          for (int h2 = 0; h2 < 2; h2++) {\n            int qq = q + DS_EPI * h2, row = qq / 24, v = qq')
    k = k[:i0] + '''        auto load = [&](int q, uint4* gv, uint4* uv) {
#pragma unroll
          for (int h2 = 0; h2 < 2; h2++) {
            int qq = q + DS_EPI * h2, row = qq / 24, col = n0 + (qq - row * 24) * 8;
            if (qq < GS_BM * 24 && m0 + row < m && col < n) {
              i64 at = (i64)(m0 + row) * n + col;
              gv[h2] = *(const uint4*)(g + at);
              uv[h2] = *(const uint4*)(u + at);
            }
          }
        };
        uint4 gv[2], uv[2];
        load(e, gv, uv);
        for (int q = e; q < GS_BM * 24; q += 2 * DS_EPI) {
          uint4 gn[2], un[2];
          load(q + 2 * DS_EPI, gn, un);
''' + k[i1:]
    rep('''            *(uint4*)(dg + at) = make_uint4(og[0], og[1], og[2], og[3]);
          }
''', '''            *(uint4*)(dg + at) = make_uint4(og[0], og[1], og[2], og[3]);
          }
#pragma unroll
          for (int h2 = 0; h2 < 2; h2++) {
            gv[h2] = gn[h2];
            uv[h2] = un[h2];
          }
''')
if len(sys.argv) > 3:
    c, e = sys.argv[3].split(',')
    rep('setmaxnreg.dec.sync.aligned.u32 56;', 'setmaxnreg.dec.sync.aligned.u32 %s;' % e)
    rep('setmaxnreg.inc.sync.aligned.u32 200;', 'setmaxnreg.inc.sync.aligned.u32 %s;' % c)
sys.stdout.write(s[:a] + k + s[b:])
