# Writes forms of gpu/cuda/kernels/gemm.cu's k_gemm_dswiglu epilogue to
# stdout, from the form with the next tile's L2 prefetch a tile ahead
# (argv[2]); argv[1] is a list of changes joined by '+':
#   pipe  each pair of vectors' g and u loads issued before the pair
#         before it is computed;
#   near  the L2 prefetch of the tile's own rows, just before its staged
#         wait (as at ff8996d), instead of a tile ahead;
#   pk    bf16: SwiGLU's two roundings for two elements in one cvt.rn.bf16x2
#         each, the outputs packed with one cvt.rn.bf16x2 without the
#         per-pair NaN test, a vector taking the exact path when a packed
#         output holds a NaN;
#   bal   the tile's vectors split evenly over the four schedulers (warp
#         12 alone on scheduler 0 takes a quarter);
#   rC,E  consumers at C registers, the other warps at E.
import sys
ch = sys.argv[1].split('+')
s = open(sys.argv[2]).read()
a = s.index('__device__ __forceinline__ void gemm_dswiglu(')
b = s.index('extern "C" __global__ void __launch_bounds__(512, 1) k_gemm_dswiglu_bf16')
k = s[a:b]
def rep(old, new):
    global k
    assert k.count(old) == 1, old
    k = k.replace(old, new)
for c in ch:
    if c == 'near':
        rep('''      int t = tq_get(tqb, tq, 0);
      if (t >= 0) prefetch(t);
      for (int i = 0; t >= 0; i++) {
        int tn = tq_get(tqb, tq, i + 1);
        if (tn >= 0) prefetch(tn);''', '''      int t = tq_get(tqb, tq, 0);
      for (int i = 0; t >= 0; i++) {
        prefetch(t);
        int tn = tq_get(tqb, tq, i + 1);''')
    elif c == 'pipe':
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
    elif c == 'pk':
        old = '''#pragma unroll
            for (int p = 0; p < 4; p++) {
              float rg[2], ru[2];
#pragma unroll
              for (int h = 0; h < 2; h++) {
                float d = gs_val<F16>(dw4[p], h), x = gs_val<F16>(gw[p], h), y = gs_val<F16>(uw[p], h);
                float s = sigmoid(x);
                ru[h] = d * rnd(dt, x * s);
                float tt = rnd(dt, d * y);
                rg[h] = tt * (s * (1.0f + x * (1.0f - s)));
              }
              og[p] = wg_pack<F16>(rg[0], rg[1]);
              ou[p] = wg_pack<F16>(ru[0], ru[1]);
            }
'''
        rep(old, '''            auto exact = [&]() {
''' + old + '''            };
            if (F16) {
              exact();
            } else {
              u32 nan = 0;
#pragma unroll
              for (int p = 0; p < 4; p++) {
                float d[2], x[2], y[2], sg[2], xs[2], dy2[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                  d[h] = gs_val<false>(dw4[p], h);
                  x[h] = gs_val<false>(gw[p], h);
                  y[h] = gs_val<false>(uw[p], h);
                  sg[h] = sigmoid(x[h]);
                  xs[h] = x[h] * sg[h];
                  dy2[h] = d[h] * y[h];
                }
                u32 a2, b2, wg2, wu2;
                asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(a2) : "f"(xs[1]), "f"(xs[0]));
                asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(b2) : "f"(dy2[1]), "f"(dy2[0]));
                float ra[2] = {__uint_as_float(a2 << 16), __uint_as_float(a2 & 0xffff0000u)};
                float rb[2] = {__uint_as_float(b2 << 16), __uint_as_float(b2 & 0xffff0000u)};
                float ru[2], rg[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                  ru[h] = d[h] * ra[h];
                  rg[h] = rb[h] * (sg[h] * (1.0f + x[h] * (1.0f - sg[h])));
                }
                asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(wg2) : "f"(rg[1]), "f"(rg[0]));
                asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(wu2) : "f"(ru[1]), "f"(ru[0]));
                // A half is a NaN when its low 15 bits pass 0x7f80.
                nan |= (((wg2 & 0x7fff7fffu) + 0x007f007fu) | ((wu2 & 0x7fff7fffu) + 0x007f007fu)) & 0x80008000u;
                og[p] = wg2;
                ou[p] = wu2;
              }
              if (nan) exact();
            }
''')
    elif c == 'bal':
        # vectors sc*768 .. sc*768+767 for scheduler sc; nth threads there.
        rep('''      int e = threadIdx.x < 128 ? threadIdx.x - 32 : threadIdx.x - 384 + 96;''',
            '''      int e = threadIdx.x < 128 ? threadIdx.x - 32 : threadIdx.x - 384 + 96;
      // The tile's vectors by scheduler (warp % 4): warp 12 alone on
      // scheduler 0, two warps on each of the others.
      const int wp = threadIdx.x >> 5, sc = wp & 3, nth = sc == 0 ? 32 : 64;
      const int vb = sc * (GS_BM * 6), ve = vb + GS_BM * 6, ix = (wp >= 12 ? 0 : 32) + (threadIdx.x & 31);''')
        k = k.replace('load(e, gv, uv);', 'load(vb + (sc == 0 ? (threadIdx.x & 31) : ix), gv, uv);')
        rep('for (int q = e; q < GS_BM * 24; q += 2 * DS_EPI) {\n          uint4 gn[2], un[2];\n          load(q + 2 * DS_EPI, gn, un);',
            'for (int q = vb + (sc == 0 ? (threadIdx.x & 31) : ix); q < ve; q += 2 * nth) {\n          uint4 gn[2], un[2];\n          load(q + 2 * nth, gn, un);')
        rep('int qq = q + DS_EPI * h2, row = qq / 24, col = n0 + (qq - row * 24) * 8;\n            if (qq < GS_BM * 24 &&',
            'int qq = q + nth * h2, row = qq / 24, col = n0 + (qq - row * 24) * 8;\n            if (qq < ve &&')
        rep('int qq = q + DS_EPI * h2, row = qq / 24, v = qq - row * 24, col = n0 + v * 8;\n            if (qq >= GS_BM * 24 ||',
            'int qq = q + nth * h2, row = qq / 24, v = qq - row * 24, col = n0 + v * 8;\n            if (qq >= ve ||')
    elif c.startswith('r'):
        cc, ee = c[1:].split(',')
        rep('setmaxnreg.dec.sync.aligned.u32 56;', 'setmaxnreg.dec.sync.aligned.u32 %s;' % ee)
        rep('setmaxnreg.inc.sync.aligned.u32 200;', 'setmaxnreg.inc.sync.aligned.u32 %s;' % cc)
    else:
        raise SystemExit('unknown change ' + c)
sys.stdout.write(s[:a] + k + s[b:])
