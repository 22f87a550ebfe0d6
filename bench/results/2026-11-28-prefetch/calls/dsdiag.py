# Writes a diagnostic form of gpu/cuda/kernels/gemm.cu (as at ff8996d) to
# stdout whose dswiglu epilogue warps time, in clock64 cycles, their
# waits for the staged tile, each pair of vectors' loads from issue to
# their data, and the rest of the pair (the staging read, SwiGLU's
# backward, the stores); lane 0 of each epilogue warp prints its totals
# ("DSPH" lines).
import sys
s = open(sys.argv[1]).read()
a = s.index('__device__ __forceinline__ void gemm_dswiglu(')
b = s.index('extern "C" __global__ void __launch_bounds__(512, 1) k_gemm_dswiglu_bf16')
k = s[a:b]
def rep(old, new):
    global k
    assert k.count(old) == 1, old
    k = k.replace(old, new)
rep('''      for (int i = 0, t; (t = tq_get(tqb, tq, i)) >= 0; i++) {
        int mt, nt;''', '''      long long tw = 0, tl = 0, tc = 0, tall = clock64();
      for (int i = 0, t; (t = tq_get(tqb, tq, i)) >= 0; i++) {
        int mt, nt;''')
rep('''        mb_wait(staged, i & 1);
        for (int q = e;''', '''        long long t0 = clock64();
        mb_wait(staged, i & 1);
        tw += clock64() - t0;
        for (int q = e;''')
rep('''          uint4 gv[2], uv[2];
#pragma unroll''', '''          uint4 gv[2], uv[2];
          gv[0] = gv[1] = uv[0] = uv[1] = make_uint4(0, 0, 0, 0);
          long long tq0 = clock64();
#pragma unroll''')
rep('''#pragma unroll
          for (int h2 = 0; h2 < 2; h2++) {
            int qq = q + DS_EPI * h2, row = qq / 24, v = qq''', '''          {
            u32 z, sink = gv[0].x ^ gv[1].x ^ uv[0].x ^ uv[1].x;
            asm volatile("mov.b32 %0, %1;" : "=r"(z) : "r"(sink));
          }
          long long tq1 = clock64();
          tl += tq1 - tq0;
#pragma unroll
          for (int h2 = 0; h2 < 2; h2++) {
            int qq = q + DS_EPI * h2, row = qq / 24, v = qq''')
rep('''            *(uint4*)(dg + at) = make_uint4(og[0], og[1], og[2], og[3]);
          }
''', '''            *(uint4*)(dg + at) = make_uint4(og[0], og[1], og[2], og[3]);
          }
          tc += clock64() - tq1;
''')
rep('''        warp_arrive(drained);
      }
    }
    return;''', '''        warp_arrive(drained);
      }
      if ((threadIdx.x & 31) == 0)
        printf("DSPH %d %d staged %lld loads %lld rest %lld total %lld\\n", blockIdx.x, threadIdx.x >> 5, tw, tl, tc,
               clock64() - tall);
    }
    return;''')
sys.stdout.write(s[:a] + k + s[b:])
