// k_gemm is the SIMT fallback for matrix products whose operand dtypes
// cuBLASLt cannot combine (e.g. an f32 operand with a bf16 one): C[m,n] =
// alpha*op(A)@op(B) + beta*C with float32 accumulation, all row-major with
// leading dimensions in elements. 64x64 tiles, 256 threads, 4x4 per thread.
//
// k_gemm_swiglu_* (further down) is the MLP's gate/up product on Hopper with
// SwiGLU in its epilogue.
//
// uses hopper.cuh

#define GT 64
#define GK 16

extern "C" __global__ void __launch_bounds__(256) k_gemm(void* C, int dtc, i64 ldc, const void* A, int dta, i64 lda,
                                                          int ta, const void* B, int dtb, i64 ldb, int tb, int m,
                                                          int n, int k, float alpha, float beta) {
  __shared__ float As[GK][GT + 4];
  __shared__ float Bs[GK][GT + 4];
  int i0 = blockIdx.y * GT, j0 = blockIdx.x * GT;
  int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  float acc[4][4];
#pragma unroll
  for (int a = 0; a < 4; a++)
#pragma unroll
    for (int b = 0; b < 4; b++) acc[a][b] = 0.0f;
  for (int k0 = 0; k0 < k; k0 += GK) {
    for (int e = threadIdx.x; e < GT * GK; e += 256) {
      int i, kk;
      if (!ta) { i = e / GK; kk = e % GK; } else { kk = e / GT; i = e % GT; }
      int gi = i0 + i, gk = k0 + kk;
      float x = 0.0f;
      if (gi < m && gk < k) x = ldf(A, dta, ta ? (i64)gk * lda + gi : (i64)gi * lda + gk);
      As[kk][i] = x;
      int j;
      if (!tb) { kk = e / GT; j = e % GT; } else { j = e / GK; kk = e % GK; }
      int gj = j0 + j;
      gk = k0 + kk;
      float y = 0.0f;
      if (gj < n && gk < k) y = ldf(B, dtb, tb ? (i64)gj * ldb + gk : (i64)gk * ldb + gj);
      Bs[kk][j] = y;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < GK; kk++) {
      float a[4], b[4];
#pragma unroll
      for (int q = 0; q < 4; q++) {
        a[q] = As[kk][ty + 16 * q];
        b[q] = Bs[kk][tx + 16 * q];
      }
#pragma unroll
      for (int p = 0; p < 4; p++)
#pragma unroll
        for (int q = 0; q < 4; q++) acc[p][q] = __fmaf_rn(a[p], b[q], acc[p][q]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int p = 0; p < 4; p++) {
    int gi = i0 + ty + 16 * p;
    if (gi >= m) continue;
#pragma unroll
    for (int q = 0; q < 4; q++) {
      int gj = j0 + tx + 16 * q;
      if (gj >= n) continue;
      i64 o = (i64)gi * ldc + gj;
      float r = alpha * acc[p][q];
      if (beta != 0.0f) {
        float cb = beta * ldf(C, dtc, o);
        r = r + cb;
      }
      stf(C, dtc, o, r);
    }
  }
}

// ---------------------------------------------------------------------------
// The gate/up product with SwiGLU in its epilogue, on Hopper: out [m, n] =
// swiglu(x·gᵀ, x·uᵀ) for x [m, k] and the gate and up weights g, u [n, k]
// (16-bit, row-major, k a multiple of 64, n of 128), with the values of
// two products rounded to the dtype and then k_swiglu8: each of gate and
// up rounded, silu(gate) rounded, times up, rounded. The accumulation
// order inside the products is this kernel's (the k-steps in order, as
// cuBLASLt's kernels without split-k take them), so their low bits may
// differ from the unfused path's.
//
// The kernel is persistent: a CTA per SM takes tiles of 128 rows of x and
// 128 output columns (tile blockIdx.x, then every gridDim.x-th after it),
// with three warpgroups.
//
// - Thread 0 copies, through the TMA (tensor maps {k, 1, rows}, 64 × 128
//   boxes with the 128-byte swizzle), the tile's x rows and its gate and
//   up rows (128 each, stacked into one 256-row operand) for each 64-wide
//   step of k into a ring of GS_ST buffers, running on into the next tile
//   while the others write this one.
// - The second and third warpgroups own 64 rows each and issue m64n256k16
//   products, so that each thread holds a column's gate and up sums side
//   by side (fragment tiles j and j+16), then apply SwiGLU and write.
//
// Tiles go in groups of GS_GROUP row tiles, so that the x and weight tiles
// the CTAs read at one time stay in L2. (Measured on an H100 and not
// kept: a staging tile in shared memory whose SwiGLU warps of their own
// computed while the next tile's products ran, which left room for only
// three buffers and lost more than it hid; and waiting for each step's
// products before issuing the next.)
// ---------------------------------------------------------------------------

#define GS_BM 128
#define GS_BN 128
#define GS_BK 64
#define GS_ST 4
#define GS_GROUP 16

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GS_ONLY(x) x
#else
#define GS_ONLY(x) __trap()
#endif

// gs_tile returns tile t's row tile mt (of nm) and column tile nt (of nn)
// in grouped order.
__device__ __forceinline__ void gs_tile(int t, int nm, int nn, int& mt, int& nt) {
  int per = GS_GROUP * nn, g = t / per, first = g * GS_GROUP;
  int sz = min(nm - first, GS_GROUP), r = t - g * per;
  mt = first + r % sz;
  nt = r / sz;
}

template <bool F16>
__device__ __forceinline__ u32 gs_pack(float lo, float hi) {
  return F16 ? ((u32)f2h(lo) | ((u32)f2h(hi) << 16)) : f2bf2(lo, hi);
}

template <bool F16>
__device__ __forceinline__ void gemm_swiglu(u16* out, const TMap* tx, const TMap* tg, const TMap* tu, int m, int n,
                                            int k) {
  constexpr int AT = GS_BM * GS_BK * 2, BT = GS_BN * GS_BK * 2, ST = AT + 2 * BT;
  u32 base;
  wg_smem(base);
  u32 bars = base + GS_ST * ST;  // full[GS_ST], then empty[GS_ST]
  int nm = (m + GS_BM - 1) / GS_BM, nn = n / GS_BN, nk = k / GS_BK, nt_all = nm * nn;
  if (threadIdx.x == 0) {
    for (int i = 0; i < GS_ST; i++) {
      mb_init(bars + 8 * i, 1);              // the producer's expect_tx
      mb_init(bars + 8 * (GS_ST + i), 256);  // the consumers' threads
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // it counts k-steps across the CTA's tiles: buffer it % GS_ST, in its
  // (it / GS_ST)-th use.
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (threadIdx.x == 0) {
      int it = 0;
      for (int t = blockIdx.x; t < nt_all; t += gridDim.x) {
        int mt, nt;
        gs_tile(t, nm, nn, mt, nt);
        int m0 = mt * GS_BM, n0 = nt * GS_BN;
        for (int kb = 0; kb < nk; kb++, it++) {
          int b = it % GS_ST;
          u32 full = bars + 8 * b, st = base + b * ST;
          if (it >= GS_ST) mb_wait(bars + 8 * (GS_ST + b), (it / GS_ST + 1) & 1);
          mb_expect(full, (u32)ST);
          tma_load3(st, tx, kb * GS_BK, 0, m0, full);
          tma_load3(st + AT, tg, kb * GS_BK, 0, n0, full);
          tma_load3(st + AT + BT, tu, kb * GS_BK, 0, n0, full);
        }
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  int grp = (threadIdx.x >> 7) - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int dt = F16 ? DT_F16 : DT_BF16;
  float d[128];
#pragma unroll
  for (int i = 0; i < 128; i++) d[i] = 0.0f;
  int it = 0;
  for (int t = blockIdx.x; t < nt_all; t += gridDim.x) {
    int mt, nt;
    gs_tile(t, nm, nn, mt, nt);
    int m0 = mt * GS_BM, n0 = nt * GS_BN;
    for (int kb = 0; kb < nk; kb++, it++) {
      int b = it % GS_ST;
      mb_wait(bars + 8 * b, (it / GS_ST) & 1);
      u32 st = base + b * ST, a = st + grp * 64 * 128, w = st + AT;
      wg_hold<32>((float(*)[4])d);
      wg_fence();
      // The tile's first product starts the sums (scale-d 0).
#pragma unroll
      for (int kk = 0; kk < GS_BK / 16; kk++)
        wg_ss256<F16, 0>(d, wg_kmajor<64>(a, kk), wg_kmajor<256>(w, kk), kb > 0 || kk > 0);
      wg_commit();
      wg_wait<1>();
      if (kb > 0) mb_arrive(bars + 8 * (GS_ST + (it - 1) % GS_ST));
    }
    wg_wait<0>();
    wg_hold<32>((float(*)[4])d);
    // The tile's last buffer goes back before the epilogue, so that the
    // producer fills it with the next tile's first step meanwhile.
    mb_arrive(bars + 8 * (GS_ST + (it - 1) % GS_ST));
    // Fragment tile j (columns 8j..8j+7 of the 256) holds, for this
    // thread, rows r and r+8, columns 8j+2c and 8j+2c+1: gate for j < 16,
    // up for the same output columns at j+16.
    int r = m0 + grp * 64 + warp * 16 + (lane >> 2), c = lane & 3;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      float y[4];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float x = rnd(dt, d[4 * j + e]), u = rnd(dt, d[4 * (j + 16) + e]);
        y[e] = rnd(dt, x * sigmoid(x)) * u;
      }
      i64 col = n0 + 8 * j + 2 * c;
      if (r < m) *(u32*)(out + (i64)r * n + col) = gs_pack<F16>(y[0], y[1]);
      if (r + 8 < m) *(u32*)(out + (i64)(r + 8) * n + col) = gs_pack<F16>(y[2], y[3]);
    }
  }
}

extern "C" __global__ void __launch_bounds__(384, 1) k_gemm_swiglu_bf16(u16* out, const __grid_constant__ TMap tx, const __grid_constant__ TMap tg, const __grid_constant__ TMap tu, int m, int n, int k) {
  GS_ONLY((gemm_swiglu<false>(out, &tx, &tg, &tu, m, n, k)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_gemm_swiglu_f16(u16* out, const __grid_constant__ TMap tx, const __grid_constant__ TMap tg, const __grid_constant__ TMap tu, int m, int n, int k) {
  GS_ONLY((gemm_swiglu<true>(out, &tx, &tg, &tu, m, n, k)));
}
