# Writes diagnostic forms of gpu/cuda/kernels/hopper.cuh and gemm.cu
# (argv: hopper.cuh gemm.cu outdir) whose persistent consumers time, in
# clock64 cycles, their waits for the ring's full buffers and for the
# epilogue's drained staging tile, and whose dswiglu epilogue times its
# waits for the staged tile; each warpgroup's first thread (and the
# epilogue's first) prints its CTA's totals at the end ("DSDBG" lines).
import sys, os
h = open(sys.argv[1]).read()
g = open(sys.argv[2]).read()
out = sys.argv[3]
def rep(s, old, new):
    assert s.count(old) == 1, old
    return s.replace(old, new)
h = rep(h, '''__device__ __forceinline__ void wg_ring_tile(float* d, u32 base, u32 bars, u32 stBytes, u32 aOff, u32 bOff, int nk,
                                             int& it) {''', '''__device__ __forceinline__ void wg_ring_tile(float* d, u32 base, u32 bars, u32 stBytes, u32 aOff, u32 bOff, int nk,
                                             int& it, long long* tf = nullptr) {''')
h = rep(h, '''    mb_wait(bars + 8 * b, (it / ST) & 1);
    u32 st = base + b * stBytes, a = st + aOff, w = st + bOff;''', '''    long long t0 = clock64();
    mb_wait(bars + 8 * b, (it / ST) & 1);
    if (tf) *tf += clock64() - t0;
    u32 st = base + b * stBytes, a = st + aOff, w = st + bOff;''')
h = rep(h, '''  int it = 0;
  for (int i = 0; tq_get(tqb, tq, i) >= 0; i++) {
    wg_ring_tile<F16, ST, N, WARP, MNB>(d, base, bars, stBytes, grp * 64 * 128, bOff, nk, it);
    if (i > 0) mb_wait(drained, (i - 1) & 1);
    wg_stage<F16, N>(stage, row, d);
    warp_arrive(staged);
  }''', '''  int it = 0;
  long long tf = 0, td = 0, ts = 0, tall = clock64();
  int nt = 0;
  for (int i = 0; tq_get(tqb, tq, i) >= 0; i++) {
    wg_ring_tile<F16, ST, N, WARP, MNB>(d, base, bars, stBytes, grp * 64 * 128, bOff, nk, it, &tf);
    long long t0 = clock64();
    if (i > 0) mb_wait(drained, (i - 1) & 1);
    long long t1 = clock64();
    td += t1 - t0;
    wg_stage<F16, N>(stage, row, d);
    warp_arrive(staged);
    ts += clock64() - t1;
    nt++;
  }
  if ((threadIdx.x & 127) == 0)
    printf("DSDBG consumer %d %d tiles %d full %lld drained %lld stage %lld total %lld\\n", blockIdx.x, grp, nt, tf, td, ts,
           clock64() - tall);''')
a = g.index('__device__ __forceinline__ void gemm_dswiglu(')
b = g.index('extern "C" __global__ void __launch_bounds__(512, 1) k_gemm_dswiglu_bf16')
k = g[a:b]
k = rep(k, '''      int e = threadIdx.x < 128 ? threadIdx.x - 32 : threadIdx.x - 384 + 96;
      for (int i = 0, t; (t = tq_get(tqb, tq, i)) >= 0; i++) {''', '''      int e = threadIdx.x < 128 ? threadIdx.x - 32 : threadIdx.x - 384 + 96;
      long long tw = 0, tall = clock64();
      for (int i = 0, t; (t = tq_get(tqb, tq, i)) >= 0; i++) {''')
k = rep(k, '''        mb_wait(staged, i & 1);
        for (int q = e;''', '''        long long t0 = clock64();
        mb_wait(staged, i & 1);
        tw += clock64() - t0;
        for (int q = e;''')
k = rep(k, '''        warp_arrive(drained);
      }
    }
    return;''', '''        warp_arrive(drained);
      }
      if (threadIdx.x == 32) printf("DSDBG epilogue %d staged %lld total %lld\\n", blockIdx.x, tw, clock64() - tall);
    }
    return;''')
g = g[:a] + k + g[b:]
open(os.path.join(out, 'hopper.cuh'), 'w').write(h)
open(os.path.join(out, 'gemm.cu'), 'w').write(g)
