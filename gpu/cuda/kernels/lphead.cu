// The log-prob head's forward on Hopper without its float32 logits in
// memory: k_lp_head_* multiplies the hidden rows h [m, k] by the vocabulary
// w [n, k] (16-bit, row-major, k a multiple of 64) tile by tile and, from
// each tile's float32 sums in registers, writes per row and tile the
// maximum of the tempered logits z = l/temp and the sum of exp(z - max)
// over the tile's columns, and the target's z where the tile holds it;
// k_lp_combine then takes each row's log-sum-exp over its tiles (in
// float64) and writes logp = z[target] - lse. LogProbs without these
// kernels writes the logits to a float32 workspace and reads them back: 10
// GB a step at Qwen2.5-3B's 16,384 tokens and 151,936-word vocabulary.
//
// k_lp_head_st_* and k_lp_head_ste_* are the train step's forward
// (LogProbs with the logits kept for LogitsBackward): the same product,
// whose epilogue also stores the tile's float32 logits to the workspace
// and, in the _ste_ form, sums per row and tile t = Σ exp(z − max)·(z −
// max) for the entropy; k_lp_combine then writes the entropies and the
// rows' statistics (logprobs.cu's layout and tag) as well.
//
// k_lp_head_* is k_gemm_qkv_*'s product (kernels/gemm_qkv.cu, and the ring
// of hopper.cuh) with its own epilogue: persistent CTAs take tiles of 128
// rows and 256 columns in grouped order from hopper.cuh's tile queue; thread 0 copies x's and w's tiles
// through the TMA into a ring of LH_ST buffers; two consumer warpgroups own
// 64 rows each and issue m64n256k16 products. Their epilogue runs in registers: fragment tile j
// holds, for this thread, rows r and r+8 and columns 8j+2c, 8j+2c+1, so a
// row's 256 columns are spread over the 4 threads of a quad, which reduce
// by shuffles. Columns past n (read as zeros by the TMA) are left out.
//
// uses hopper.cuh

#define LH_BM 128
#define LH_BN 256
#define LH_BK 64
#define LH_ST 4
#define LH_GROUP 16

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LH_ONLY(x) x
#else
#define LH_ONLY(x) __trap()
#endif

// part is [m, nn] float2 (max, sum of exponentials); tz is [m] float, the
// target's tempered logit, written by the one thread whose tile holds it.
// With STORE the raw logits l go to lg [m, n] (n even, lg 8-byte aligned);
// with ENT (and STORE) pt [m, nn] gets each row and tile's
// Σ exp(z − max)·(z − max).
template <bool F16, bool STORE, bool ENT>
__device__ __forceinline__ void lp_head(float2* part, float* pt, float* tz, float* lg, const int* targets, int* ctr,
                                        const TMap* tx, const TMap* tw, int m, int n, int k, float temp) {
  constexpr int AT = LH_BM * LH_BK * 2, BT = LH_BN * LH_BK * 2, ST = AT + BT;
  u32 base;
  u16* gbase = wg_smem(base);
  u32 bars = base + LH_ST * ST;  // full[LH_ST], empty[LH_ST]
  u32 tqb = bars + 16 * LH_ST;   // the tile queue's mbarriers, then its slots
  int* tq = tq_slots(gbase, base, tqb);
  int nm = (m + LH_BM - 1) / LH_BM, nn = (n + LH_BN - 1) / LH_BN, nk = k / LH_BK, nt_all = nm * nn;
  if (threadIdx.x == 0) {
    wg_ring_init<LH_ST, true>(bars);
    tq_init(tqb, 8);  // read by the consumers' warps
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (threadIdx.x == 0) {
      wg_produce<LH_ST, LH_GROUP>(base, bars, ST, nk, tqb, tq, ctr, nt_all, nm, nn,
                                  [&](u32 st, u32 full, int mt, int nt, int kb) {
                                    tma_load3(st, tx, kb * LH_BK, 0, mt * LH_BM, full);
                                    tma_load3(st + AT, tw, kb * LH_BK, 0, nt * LH_BN, full);
                                  });
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  int grp = (threadIdx.x >> 7) - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, c = lane & 3;
  float d[128];
#pragma unroll
  for (int i = 0; i < 128; i++) d[i] = 0.0f;
  int it = 0;
  for (int i = 0, t; (t = tq_get(tqb, tq, i)) >= 0; i++) {
    int mt, nt;
    wg_tile_order<LH_GROUP>(t, nm, nn, mt, nt);
    wg_ring_tile<F16, LH_ST, 256, true>(d, base, bars, ST, grp * 64 * 128, AT, nk, it);
    int m0 = mt * LH_BM, n0 = nt * LH_BN;
    int r0 = m0 + grp * 64 + warp * 16 + (lane >> 2), r1 = r0 + 8;
    int y0 = r0 < m ? targets[r0] : -1, y1 = r1 < m ? targets[r1] : -1;
    if constexpr (STORE) {
      // A quad's four float2s of a row are 32 contiguous bytes: whole
      // sectors. n is even, so a pair is wholly in or out.
      float* l0 = lg + (i64)r0 * n;
      float* l1 = lg + (i64)r1 * n;
#pragma unroll
      for (int j = 0; j < 32; j++) {
        int col = n0 + 8 * j + 2 * c;
        if (col < n) {
          if (r0 < m) __stcs((float2*)(l0 + col), make_float2(d[4 * j], d[4 * j + 1]));
          if (r1 < m) __stcs((float2*)(l1 + col), make_float2(d[4 * j + 2], d[4 * j + 3]));
        }
      }
    }
    // Per element, only what every tile needs: the tempered logit, the
    // maximum, and the exponential as one fma and ex2. The columns past n
    // (the last column tile) and the targets' logits (in one tile of a
    // row's ~600) are handled apart.
    if (temp != 1.0f) {
#pragma unroll
      for (int i = 0; i < 128; i++) d[i] = d[i] / temp;
    }
    if (n0 + LH_BN > n) {
#pragma unroll
      for (int j = 0; j < 32; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
          if (n0 + 8 * j + 2 * c + e >= n) d[4 * j + e] = d[4 * j + 2 + e] = -F_INF;
        }
      }
    }
    bool t0 = y0 >= n0 && y0 < n0 + LH_BN, t1 = y1 >= n0 && y1 < n0 + LH_BN;
    if (__any_sync(0xffffffffu, t0 || t1)) {
#pragma unroll
      for (int j = 0; j < 32; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
          int col = n0 + 8 * j + 2 * c + e;
          if (col == y0) tz[r0] = d[4 * j + e];
          if (col == y1) tz[r1] = d[4 * j + 2 + e];
        }
      }
    }
    float mx0 = -F_INF, mx1 = -F_INF;
#pragma unroll
    for (int j = 0; j < 32; j++) {
      mx0 = fmaxf(mx0, fmaxf(d[4 * j], d[4 * j + 1]));
      mx1 = fmaxf(mx1, fmaxf(d[4 * j + 2], d[4 * j + 3]));
    }
    mx0 = quad_max(mx0);
    mx1 = quad_max(mx1);
    // exp(z − mx) = 2^(z·log2 e − mx·log2 e); a row of one tile's columns
    // all past n has mx −Inf and no terms.
    float b0 = mx0 == -F_INF ? 0.0f : mx0 * LOG2E, b1 = mx1 == -F_INF ? 0.0f : mx1 * LOG2E;
    float s0 = 0.0f, s1 = 0.0f, q0 = 0.0f, q1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; j++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        float e0 = exp2_approx(fmaf(d[4 * j + e], LOG2E, -b0));
        float e1 = exp2_approx(fmaf(d[4 * j + 2 + e], LOG2E, -b1));
        s0 += e0;
        s1 += e1;
        if constexpr (ENT) {
          // A column past n (z −Inf) has weight 0 and no term: 0·(−Inf)
          // would be NaN.
          q0 += e0 > 0.0f ? e0 * (d[4 * j + e] - mx0) : 0.0f;
          q1 += e1 > 0.0f ? e1 * (d[4 * j + 2 + e] - mx1) : 0.0f;
        }
      }
    }
    s0 = quad_sum(s0);
    s1 = quad_sum(s1);
    if constexpr (ENT) {
      q0 = quad_sum(q0);
      q1 = quad_sum(q1);
    }
    if (c == 0) {
      if (r0 < m) part[(i64)r0 * nn + nt] = make_float2(mx0, s0);
      if (r1 < m) part[(i64)r1 * nn + nt] = make_float2(mx1, s1);
      if constexpr (ENT) {
        if (r0 < m) pt[(i64)r0 * nn + nt] = q0;
        if (r1 < m) pt[(i64)r1 * nn + nt] = q1;
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(384, 1) k_lp_head_bf16(float2* part, float* pt, float* tz, float* lg, const int* targets, int* ctr, const __grid_constant__ TMap tx, const __grid_constant__ TMap tw, int m, int n, int k, float temp) {
  LH_ONLY((lp_head<false, false, false>(part, pt, tz, lg, targets, ctr, &tx, &tw, m, n, k, temp)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_lp_head_f16(float2* part, float* pt, float* tz, float* lg, const int* targets, int* ctr, const __grid_constant__ TMap tx, const __grid_constant__ TMap tw, int m, int n, int k, float temp) {
  LH_ONLY((lp_head<true, false, false>(part, pt, tz, lg, targets, ctr, &tx, &tw, m, n, k, temp)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_lp_head_st_bf16(float2* part, float* pt, float* tz, float* lg, const int* targets, int* ctr, const __grid_constant__ TMap tx, const __grid_constant__ TMap tw, int m, int n, int k, float temp) {
  LH_ONLY((lp_head<false, true, false>(part, pt, tz, lg, targets, ctr, &tx, &tw, m, n, k, temp)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_lp_head_st_f16(float2* part, float* pt, float* tz, float* lg, const int* targets, int* ctr, const __grid_constant__ TMap tx, const __grid_constant__ TMap tw, int m, int n, int k, float temp) {
  LH_ONLY((lp_head<true, true, false>(part, pt, tz, lg, targets, ctr, &tx, &tw, m, n, k, temp)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_lp_head_ste_bf16(float2* part, float* pt, float* tz, float* lg, const int* targets, int* ctr, const __grid_constant__ TMap tx, const __grid_constant__ TMap tw, int m, int n, int k, float temp) {
  LH_ONLY((lp_head<false, true, true>(part, pt, tz, lg, targets, ctr, &tx, &tw, m, n, k, temp)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_lp_head_ste_f16(float2* part, float* pt, float* tz, float* lg, const int* targets, int* ctr, const __grid_constant__ TMap tx, const __grid_constant__ TMap tw, int m, int n, int k, float temp) {
  LH_ONLY((lp_head<true, true, true>(part, pt, tz, lg, targets, ctr, &tx, &tw, m, n, k, temp)));
}

// k_lp_combine writes logp[r] = tz[r] - lse for each of the m rows, one warp
// a row: lse = M + log(S), S = sum_j s_j exp(m_j - M) over the row's nn
// tiles (m_j, s_j) = part[r, j], M their maximum, the sum in float64. A
// target outside [0, v) writes NaN and raises FLAG_TARGETS, as k_lp_fwd
// does. Where pt is not null (k_lp_head_ste_*), A = sum_j exp(m_j - M)·(t_j
// + (m_j - M) s_j) with t_j = pt[r, j] makes the mean of z under softmax(z)
// M + A/S, and ent[r] = log(S) − A/S, z's entropy. Where stats is not null,
// row r's statistics go to stats[4r..4r+3] as k_lp_fwd leaves them for
// k_lp_bwd8: lseZ, lseU (= lseZ), the mean (0 without pt) and the tag of
// temp and LP_LSE or LP_ENT_Z.
extern "C" __global__ void __launch_bounds__(256) k_lp_combine(const float2* part, const float* pt, const float* tz,
                                                               const int* targets, int m, int nn, int v, float temp,
                                                               float* logp, float* ent, double* stats, int* flag) {
  int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  for (i64 r = (i64)blockIdx.x * nw + (threadIdx.x >> 5); r < m; r += (i64)gridDim.x * nw) {
    const float2* p = part + r * nn;
    const float* q = pt ? pt + r * nn : 0;
    float mx = -F_INF;
    for (int j = lane; j < nn; j += 32) mx = fmaxf(mx, p[j].x);
    mx = warp_max(mx);
    double s = 0.0, a = 0.0;
    for (int j = lane; j < nn; j += 32) {
      float2 x = p[j];
      double w = (double)expf(x.x - mx);
      s += (double)x.y * w;
      if (q) a += w * ((double)q[j] + ((double)x.x - (double)mx) * (double)x.y);
    }
    s = warp_sum_d(s);
    if (q) a = warp_sum_d(a);
    if (lane == 0) {
      double lse = (double)mx + log(s);
      int y = targets[r];
      if (y < 0 || y >= v) {
        atomicOr(flag, FLAG_TARGETS);
        logp[r] = __int_as_float(0x7fc00000);
      } else {
        logp[r] = (float)((double)tz[r] - lse);
      }
      if (ent) ent[r] = (float)(log(s) - a / s);
      if (stats) {
        double* o = stats + 4 * r;
        o[0] = lse, o[1] = lse, o[2] = q ? (double)mx + a / s : 0.0;
        o[3] = stats_tag(temp, q ? LP_ENT_Z : LP_LSE);
      }
    }
  }
}
