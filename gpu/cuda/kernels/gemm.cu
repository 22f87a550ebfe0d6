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
// (16-bit, row-major, k a multiple of 64, n of 8), with the values of two
// products rounded to the dtype and then k_swiglu8: each of gate and up
// rounded, silu(gate) rounded, times up, rounded. Where gout and uout are
// not null (a forward that a backward follows), the epilogue also stores
// the two rounded products there [m, n], which k_swiglu8 turns into out's
// bits again. The accumulation order inside the products is this
// kernel's (the k-steps in order, as cuBLASLt's kernels without split-k
// take them), so their low bits may differ from the unfused path's.
//
// The kernel is persistent: a CTA per SM takes tiles of 128 rows of x and
// 96 output columns (from hopper.cuh's tile queue, counter ctr), with three
// warpgroups, so that four 40 KB buffers and a 50 KB staging tile fit in
// shared memory:
//
// - thread 0 takes the CTA's tiles and copies, through the TMA (tensor
//   maps {k, 1, rows}, 64-wide boxes with the 128-byte swizzle), the
//   tile's 128 x rows and its 96 gate and 96 up rows (stacked into one
//   192-row operand) for each 64-wide step of k into a ring of GS_ST
//   buffers, running on into the next tile while the others work on this
//   one;
// - the second and third warpgroups own 64 rows each and issue m64n192k16
//   products (gate in fragment tiles 0-11, up in 12-23), round the tile's
//   sums to the dtype into the staging tile and go on to the next tile;
// - warps 1-3 apply SwiGLU from the staging tile and write 16 bytes at a
//   time (and the two products too, where kept) while the tensor cores run
//   the next tile.
//
// The TMA reads weight rows past n as zeros, and the columns past n are not
// written. Tiles go in groups of GS_GROUP row tiles, so that the x and
// weight tiles the CTAs read at one time stay in L2.
//
// Measured on an H100 and not kept (bench/results/2026-11-27-h100-gemm-swiglu/
// and 2026-11-27-h100-gate-up-96/):
// - tiles of 128 output columns with the epilogue in the consumers'
//   registers: slower than the unfused ops at 3B and 1.5B shapes with
//   scrambled operands;
// - the same with a staging tile, which left room for three buffers only;
// - clusters of two CTAs sharing the weight tiles by multicast: about 1.4
//   times slower;
// - tiles of 192 rows (three consumer warpgroups, three buffers): slower.
// ---------------------------------------------------------------------------

#define GS_BM 128
#define GS_BN 96
#define GS_BK 64
#define GS_ST 4
#define GS_GROUP 16

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GS_ONLY(x) x
#else
#define GS_ONLY(x) __trap()
#endif

#define GS_ROW 400  // a staging row's bytes: 192 values and 16 bytes of padding (no bank conflicts)

// gs_val is the low (hi 0) or high 16-bit value of w as a float.
template <bool F16>
__device__ __forceinline__ float gs_val(u32 w, int hi) {
  u16 h = (u16)(hi ? w >> 16 : w);
  return F16 ? h2f(h) : bf2f(h);
}

// swiglu8 is swiglu1 (k_swiglu8's) for 8 outputs from the words of the
// gate and up products g and u: o, their words. For bf16 it rounds each
// pair's two values together (bf16x2_rn) and takes f2bf2's path (exact)
// only for a vector with a NaN among its outputs: the same bits, in fewer
// instructions than a rounding a value (the epilogues are
// instruction-bound). Where the hardware gives canonical NaNs, both paths
// give a NaN output the same bits, so no test tells which one ran.
template <bool F16>
__device__ __forceinline__ void swiglu8(const u32* g, const u32* u, u32* o) {
  const int dt = F16 ? DT_F16 : DT_BF16;
  auto exact = [&]() {
#pragma unroll
    for (int p = 0; p < 4; p++) {
      o[p] = wg_pack<F16>(swiglu1(dt, gs_val<F16>(g[p], 0), gs_val<F16>(u[p], 0)),
                          swiglu1(dt, gs_val<F16>(g[p], 1), gs_val<F16>(u[p], 1)));
    }
  };
  if (F16) {
    exact();
    return;
  }
  u32 nan = 0;
#pragma unroll
  for (int p = 0; p < 4; p++) {
    float x0 = gs_val<false>(g[p], 0), x1 = gs_val<false>(g[p], 1);
    u32 a = bf16x2_rn(x0 * sigmoid(x0), x1 * sigmoid(x1));
    o[p] = bf16x2_rn(__uint_as_float(a << 16) * gs_val<false>(u[p], 0),
                     __uint_as_float(a & 0xffff0000u) * gs_val<false>(u[p], 1));
    nan |= bf16x2_nan(o[p]);
  }
  if (nan) exact();
}

// dswiglu8 is dswiglu1 (k_swiglu_bwd8's) for 8 outputs from the words of
// dact (d) and the gate and up products (g, u): dg and du, their words.
// For bf16 it rounds pairs together as swiglu8 does, then dswiglu_tail.
template <bool F16>
__device__ __forceinline__ void dswiglu8(const u32* d, const u32* g, const u32* u, u32* dg, u32* du) {
  const int dt = F16 ? DT_F16 : DT_BF16;
  auto exact = [&]() {
#pragma unroll
    for (int p = 0; p < 4; p++) {
      float rg[2], ru[2];
#pragma unroll
      for (int h = 0; h < 2; h++) dswiglu1(dt, gs_val<F16>(d[p], h), gs_val<F16>(g[p], h), gs_val<F16>(u[p], h), rg[h], ru[h]);
      dg[p] = wg_pack<F16>(rg[0], rg[1]);
      du[p] = wg_pack<F16>(ru[0], ru[1]);
    }
  };
  if (F16) {
    exact();
    return;
  }
  u32 nan = 0;
#pragma unroll
  for (int p = 0; p < 4; p++) {
    float dd[2], x[2], s[2], xs[2], dy[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      dd[h] = gs_val<false>(d[p], h);
      x[h] = gs_val<false>(g[p], h);
      s[h] = sigmoid(x[h]);
      xs[h] = x[h] * s[h];
      dy[h] = dd[h] * gs_val<false>(u[p], h);
    }
    u32 a = bf16x2_rn(xs[0], xs[1]), b = bf16x2_rn(dy[0], dy[1]);
    float ra[2] = {__uint_as_float(a << 16), __uint_as_float(a & 0xffff0000u)};
    float rb[2] = {__uint_as_float(b << 16), __uint_as_float(b & 0xffff0000u)};
    float rg[2], ru[2];
#pragma unroll
    for (int h = 0; h < 2; h++) dswiglu_tail(dd[h], x[h], s[h], ra[h], rb[h], rg[h], ru[h]);
    dg[p] = bf16x2_rn(rg[0], rg[1]);
    du[p] = bf16x2_rn(ru[0], ru[1]);
    nan |= bf16x2_nan(dg[p]) | bf16x2_nan(du[p]);
  }
  if (nan) exact();
}

template <bool F16>
__device__ __forceinline__ void gemm_swiglu(u16* out, u16* gout, u16* uout, int* ctr, const TMap* tx, const TMap* tg,
                                            const TMap* tu, int m, int n, int k) {
  constexpr int AT = GS_BM * GS_BK * 2, BT = GS_BN * GS_BK * 2, ST = AT + 2 * BT;
  // The ring, the staging tile, their mbarriers and the tile queue
  // (3 epilogue warps).
  const WgStaged w = wg_staged<GS_ST, true>(ST, GS_BM, GS_ROW, 3);
  const u32 base = w.base, bars = w.bars, staged = w.staged, drained = w.drained, tqb = w.tqb, stage = w.stage;
  const char* gstage = w.gstage;
  int* tq = w.tq;
  int nm = (m + GS_BM - 1) / GS_BM, nn = (n + GS_BN - 1) / GS_BN, nk = k / GS_BK, nt_all = nm * nn;
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
    if (threadIdx.x == 0) {
      wg_produce<GS_ST, GS_GROUP>(base, bars, ST, nk, tqb, tq, ctr, nt_all, nm, nn,
                                  [&](u32 st, u32 full, int mt, int nt, int kb) {
                                    tma_load3(st, tx, kb * GS_BK, 0, mt * GS_BM, full);
                                    tma_load3(st + AT, tg, kb * GS_BK, 0, nt * GS_BN, full);
                                    tma_load3(st + AT + BT, tu, kb * GS_BK, 0, nt * GS_BN, full);
                                  });
    } else if (threadIdx.x >= 32) {
      // The epilogue: 12 vectors of 8 outputs per row.
      int e = threadIdx.x - 32;
      for (int i = 0, t; (t = tq_get(tqb, tq, i)) >= 0; i++) {
        int mt, nt;
        wg_tile_order<GS_GROUP>(t, nm, nn, mt, nt);
        int m0 = mt * GS_BM, n0 = nt * GS_BN;
        mb_wait(staged, i & 1);
        for (int q = e; q < GS_BM * 12; q += 96) {
          int row = q / 12, v = q - row * 12;
          uint4 g = *(const uint4*)(gstage + row * GS_ROW + v * 16);
          uint4 u = *(const uint4*)(gstage + row * GS_ROW + 2 * GS_BN + v * 16);
          u32 gw[4] = {g.x, g.y, g.z, g.w}, uw[4] = {u.x, u.y, u.z, u.w}, o[4];
          swiglu8<F16>(gw, uw, o);
          int col = n0 + v * 8;
          if (m0 + row < m && col < n) {
            i64 at = (i64)(m0 + row) * n + col;
            *(uint4*)(out + at) = make_uint4(o[0], o[1], o[2], o[3]);
            if (gout) {
              *(uint4*)(gout + at) = g;
              *(uint4*)(uout + at) = u;
            }
          }
        }
        warp_arrive(drained);
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
  // Fragment tile j (columns 8j..8j+7 of the 192: gate for j < 12, up for
  // the same output columns at j+12) is staged at the same columns.
  wg_consume<F16, GS_ST, 192, true>(base, bars, ST, AT, nk, tqb, tq, stage, GS_ROW, staged, drained);
}

extern "C" __global__ void __launch_bounds__(384, 1) k_gemm_swiglu_bf16(u16* out, u16* gout, u16* uout, int* ctr, const __grid_constant__ TMap tx, const __grid_constant__ TMap tg, const __grid_constant__ TMap tu, int m, int n, int k) {
  GS_ONLY((gemm_swiglu<false>(out, gout, uout, ctr, &tx, &tg, &tu, m, n, k)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_gemm_swiglu_f16(u16* out, u16* gout, u16* uout, int* ctr, const __grid_constant__ TMap tx, const __grid_constant__ TMap tg, const __grid_constant__ TMap tu, int m, int n, int k) {
  GS_ONLY((gemm_swiglu<true>(out, gout, uout, ctr, &tx, &tg, &tu, m, n, k)));
}

// ---------------------------------------------------------------------------
// The down projection's input gradient with SwiGLU's backward in its
// epilogue, on Hopper: for dy [m, k] (the gradient of the down projection's
// output, k the hidden size), the down weight w [k, n] (row-major, n the
// intermediate size) and the gate and up products g, u [m, n] (16-bit, k a
// multiple of 64, n of 8), dact = dy·w rounded to the dtype and then
// k_swiglu_bwd8 of it: dg and du [m, n], element for element the same
// operations, so that they are its bits for this dact. dact is never
// stored. Its accumulation order is this kernel's (the k-steps in order),
// so its low bits may differ from cuBLASLt's product's.
//
// The persistent CTA of k_gemm_swiglu_* (tiles from the tile queue,
// counter ctr; four 40 KB buffers and a 50 KB staging tile), on tiles of
// 128 rows of dy and 192 output columns, with a fourth warpgroup for the
// epilogue, which has more to do here (two loads and two stores of each
// output, SwiGLU's backward): with three warps, as k_gemm_swiglu_* has,
// it took about twice the tile's products (BenchmarkDownSwiGLUBackward on
// an H100):
//
// - thread 0 copies, through the TMA, the tile's 128 dy rows (tensor map
//   {k, 1, m}, 64-wide boxes) and, for each 64-wide step of k, w's 64 rows
//   of the tile's 192 columns as three 64-column boxes (tensor map {n, 1,
//   k}), each 64 rows of 128 bytes: an MN-major operand;
// - the second and third warpgroups own 64 rows each and issue m64n192k16
//   products with B transposed, round the tile's sums to the dtype into
//   the staging tile and go on to the next tile;
// - warps 1-3 and the fourth warpgroup prefetch the tile's g and u rows
//   into L2 as soon as they know the tile (cp.async.bulk.prefetch, a row
//   at a time), then, once the tile is staged, read them two vectors of 8
//   a thread at a time, each pair's loads issued before the pair before
//   it is computed (dswiglu8), and write dg and du 16 bytes at a time while
//   the tensor cores run the next tile.
//
// The epilogue is the kernel's bound: its warps are busy throughout and
// the consumers wait for them (their clocks, docs/performance.md), on
// its instructions, not its loads (about 6% of its time waiting for
// them). So the consumers run at 160 registers (their accumulators take
// 96), which leaves the other warps 96 for the loads in flight, and
// dswiglu8 rounds values two at a time.
//
// The TMA reads w's columns past n as zeros, and outputs past n are not
// written.
// ---------------------------------------------------------------------------

#define DS_BN 192
#define DS_EPI 224  // the epilogue's threads: warps 1-3 and 12-15

template <bool F16>
__device__ __forceinline__ void gemm_dswiglu(u16* dg, u16* du, int* ctr, const TMap* ty, const TMap* tw, const u16* g,
                                             const u16* u, int m, int n, int k) {
  constexpr int AT = GS_BM * GS_BK * 2, BB = GS_BK * 128, ST = AT + 3 * BB;
  // The ring, the staging tile, their mbarriers and the tile queue
  // (7 epilogue warps).
  const WgStaged w = wg_staged<GS_ST, true>(ST, GS_BM, GS_ROW, 7);
  const u32 base = w.base, bars = w.bars, staged = w.staged, drained = w.drained, tqb = w.tqb, stage = w.stage;
  const char* gstage = w.gstage;
  int* tq = w.tq;
  int nm = (m + GS_BM - 1) / GS_BM, nn = (n + DS_BN - 1) / DS_BN, nk = k / GS_BK, nt_all = nm * nn;
  if (threadIdx.x < 128 || threadIdx.x >= 384) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 96;\n" ::: "memory");
    if (threadIdx.x == 0) {
      wg_produce<GS_ST, GS_GROUP>(base, bars, ST, nk, tqb, tq, ctr, nt_all, nm, nn,
                                  [&](u32 st, u32 full, int mt, int nt, int kb) {
                                    tma_load3(st, ty, kb * GS_BK, 0, mt * GS_BM, full);
#pragma unroll
                                    for (int j3 = 0; j3 < 3; j3++)
                                      tma_load3(st + AT + j3 * BB, tw, nt * DS_BN + 64 * j3, 0, kb * GS_BK, full);
                                  });
    } else if (threadIdx.x >= 32) {
      // The epilogue: 24 vectors of 8 outputs per row, two a thread at a
      // time.
      int e = threadIdx.x < 128 ? threadIdx.x - 32 : threadIdx.x - 384 + 96;
      for (int i = 0, t; (t = tq_get(tqb, tq, i)) >= 0; i++) {
        int mt, nt;
        wg_tile_order<GS_GROUP>(t, nm, nn, mt, nt);
        int m0 = mt * GS_BM, n0 = nt * DS_BN;
        // The tile's g and u rows into L2 (one bulk prefetch a row of
        // each) while the tensor cores run its products, so that the
        // loads below find them there.
        u32 bytes = (u32)min(DS_BN, n - n0) * 2;
#pragma unroll 1
        for (int r = e; r < 2 * GS_BM; r += DS_EPI) {
          int row = r >> 1;
          if (m0 + row < m) {
            const u16* src = ((r & 1) ? u : g) + (i64)(m0 + row) * n + n0;
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
          }
        }
        mb_wait(staged, i & 1);
        // Each pair's loads go out before the pair before it is computed.
        auto load = [&](int q, uint4* gv, uint4* uv) {
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
#pragma unroll
          for (int h2 = 0; h2 < 2; h2++) {
            int qq = q + DS_EPI * h2, row = qq / 24, v = qq - row * 24, col = n0 + v * 8;
            if (qq >= GS_BM * 24 || m0 + row >= m || col >= n) continue;
            i64 at = (i64)(m0 + row) * n + col;
            uint4 dv = *(const uint4*)(gstage + row * GS_ROW + v * 16);
            u32 dw4[4] = {dv.x, dv.y, dv.z, dv.w}, gw[4] = {gv[h2].x, gv[h2].y, gv[h2].z, gv[h2].w},
                uw[4] = {uv[h2].x, uv[h2].y, uv[h2].z, uv[h2].w}, og[4], ou[4];
            dswiglu8<F16>(dw4, gw, uw, og, ou);
            *(uint4*)(du + at) = make_uint4(ou[0], ou[1], ou[2], ou[3]);
            *(uint4*)(dg + at) = make_uint4(og[0], og[1], og[2], og[3]);
          }
#pragma unroll
          for (int h2 = 0; h2 < 2; h2++) {
            gv[h2] = gn[h2];
            uv[h2] = un[h2];
          }
        }
        warp_arrive(drained);
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n" ::: "memory");
  wg_consume<F16, GS_ST, 192, true, true>(base, bars, ST, AT, nk, tqb, tq, stage, GS_ROW, staged, drained);
}

extern "C" __global__ void __launch_bounds__(512, 1) k_gemm_dswiglu_bf16(u16* dg, u16* du, int* ctr, const __grid_constant__ TMap ty, const __grid_constant__ TMap tw, const u16* g, const u16* u, int m, int n, int k) {
  GS_ONLY((gemm_dswiglu<false>(dg, du, ctr, &ty, &tw, g, u, m, n, k)));
}
extern "C" __global__ void __launch_bounds__(512, 1) k_gemm_dswiglu_f16(u16* dg, u16* du, int* ctr, const __grid_constant__ TMap ty, const __grid_constant__ TMap tw, const u16* g, const u16* u, int m, int n, int k) {
  GS_ONLY((gemm_dswiglu<true>(dg, du, ctr, &ty, &tw, g, u, m, n, k)));
}
