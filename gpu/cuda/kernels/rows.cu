// Row kernels: RMSNorm forward and backward, RoPE, embedding gather and
// scatter. Reductions run in float64 like the CPU reference.

// rms_rstd is RMSNorm's 1/sqrt(mean + eps) for a row of h values whose
// squares sum to ss: the mean rounded to float32 first, as HF's float32
// variance is.
__device__ __forceinline__ float rms_rstd(double ss, i64 h, float eps) {
  double mean = h > 0 ? ss / (double)h : 0.0;
  return (float)(1.0 / sqrt((double)((float)mean + eps)));
}

// k_rmsnorm: one block per row of x [rows,h]. dst may be x.
extern "C" __global__ void k_rmsnorm(void* dst, int dtd, float* rstd, const void* x, int dtx, const void* w, int dtw,
                                     i64 rows, i64 h, float eps) {
  __shared__ double sh[33];
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    double ss = 0.0;
    for (i64 j = threadIdx.x; j < h; j += blockDim.x) {
      double v = (double)ldf(x, dtx, r * h + j);
      ss += v * v;
    }
    ss = block_sum_d(ss, sh);
    float rv = rms_rstd(ss, h, eps);
    if (threadIdx.x == 0) rstd[r] = rv;
    for (i64 j = threadIdx.x; j < h; j += blockDim.x) {
      float v = ldf(x, dtx, r * h + j);
      float o = ldf(w, dtw, j) * rnd(dtx, v * rv);
      stf(dst, dtd, r * h + j, o);
    }
    __syncthreads();
  }
}

// k_rmsnorm_bwd computes dx (which may be dy) one block per row.
extern "C" __global__ void k_rmsnorm_bwd(void* dx, int dtdx, const void* dy, int dtdy, const void* x, int dtx,
                                         const void* w, int dtw, const float* rstd, i64 rows, i64 h) {
  __shared__ double sh[33];
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    double rv = (double)rstd[r];
    double dot = 0.0;
    for (i64 j = threadIdx.x; j < h; j += blockDim.x) {
      double xn = (double)ldf(x, dtx, r * h + j) * rv;
      double gw = (double)ldf(dy, dtdy, r * h + j) * (double)ldf(w, dtw, j);
      dot += gw * xn;
    }
    dot = block_sum_d(dot, sh);
    if (h > 0) dot /= (double)h;
    for (i64 j = threadIdx.x; j < h; j += blockDim.x) {
      double xn = (double)ldf(x, dtx, r * h + j) * rv;
      double gw = (double)ldf(dy, dtdy, r * h + j) * (double)ldf(w, dtw, j);
      stf(dx, dtdx, r * h + j, (float)(rv * (gw - xn * dot)));
    }
    __syncthreads();
  }
}

// k_rmsnorm_dw accumulates dw[j] += sum_r dy[r,j]*x[r,j]*rstd[r] in float64.
// Block (32,8) over 32 columns; the 8 row lanes are reduced in a fixed order.
extern "C" __global__ void k_rmsnorm_dw(void* dw, int dtdw, const void* dy, int dtdy, const void* x, int dtx,
                                        const float* rstd, i64 rows, i64 h) {
  __shared__ double sh[8][33];
  i64 col = (i64)blockIdx.x * 32 + threadIdx.x;
  double s = 0.0;
  if (col < h)
    for (i64 r = threadIdx.y; r < rows; r += 8) {
      double xn = (double)ldf(x, dtx, r * h + col) * (double)rstd[r];
      s += (double)ldf(dy, dtdy, r * h + col) * xn;
    }
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < h) {
    double t = 0.0;
    for (int k = 0; k < 8; k++) t += sh[k][threadIdx.x];
    stf(dw, dtdw, col, (float)((double)ldf(dw, dtdw, col) + t));
  }
}

// The *8 RMSNorm kernels below compute the same float64 quantities as the
// kernels above on 8-column groups with 16-byte loads. The Go side uses them
// when h is a multiple of 8, the operands are 16-byte aligned and every
// dtype is a float dtype; blockDim.x is a multiple of 32.

// rmsnorm8 is RMSNorm over rows of 8-column groups: one block per row
// (grid-striding), threads over the row's groups. With ADD, the row is
// sum = a + b, which it writes (in dts) on the way: each thread sums,
// rounds to dts and stores its groups, and rereads them from sum for the
// normalised row, so the values are those of an add into sum followed by
// the norm over it (AddRMSNorm), with one pass over the row fewer; sum may
// be a or b. Without ADD, the row is a (in dta) and sum and b are unused.
template <bool ADD>
__device__ void rmsnorm8(void* sum, int dts, void* dst, int dtd, float* rstd, const void* a, int dta, const void* b,
                         int dtb, const void* w, int dtw, i64 rows, i64 h, float eps) {
  __shared__ double sh[33];
  i64 ng = h / 8;
  const void* x = ADD ? (const void*)sum : a;
  int dtx = ADD ? dts : dta;
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    double ss = 0.0;
    for (i64 g = threadIdx.x; g < ng; g += blockDim.x) {
      float v[8];
      ld8(a, dta, r * h + g * 8, v);
      if (ADD) {
        float u[8];
        ld8(b, dtb, r * h + g * 8, u);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = rnd(dts, v[k] + u[k]);
        st8(sum, dts, r * h + g * 8, v);
      }
#pragma unroll
      for (int k = 0; k < 8; k++) ss += (double)v[k] * (double)v[k];
    }
    ss = block_sum_d(ss, sh);
    float rv = rms_rstd(ss, h, eps);
    if (threadIdx.x == 0) rstd[r] = rv;
    for (i64 g = threadIdx.x; g < ng; g += blockDim.x) {
      float v[8], wv[8];
      ld8(x, dtx, r * h + g * 8, v);
      ld8(w, dtw, g * 8, wv);
#pragma unroll
      for (int k = 0; k < 8; k++) v[k] = wv[k] * rnd(dtx, v[k] * rv);
      st8(dst, dtd, r * h + g * 8, v);
    }
    __syncthreads();
  }
}

extern "C" __global__ void __launch_bounds__(1024) k_rmsnorm8(void* dst, int dtd, float* rstd, const void* x, int dtx,
                                                              const void* w, int dtw, i64 rows, i64 h, float eps) {
  rmsnorm8<false>(0, 0, dst, dtd, rstd, x, dtx, 0, 0, w, dtw, rows, h, eps);
}

extern "C" __global__ void __launch_bounds__(1024) k_add_rmsnorm8(void* sum, int dts, void* dst, int dtd, float* rstd,
                                                                  const void* a, int dta, const void* b, int dtb,
                                                                  const void* w, int dtw, i64 rows, i64 h, float eps) {
  rmsnorm8<true>(sum, dts, dst, dtd, rstd, a, dta, b, dtb, w, dtw, rows, h, eps);
}

// The *_r kernels are the RMSNorm forward of float32 rows (the decoder's
// residual stream) into a 16-bit dtype DT (with weights of DT), for rows of
// 33 to 512 column groups (256 < h <= 4096): one warp per row, lane l
// holding the row's groups l, l+32, ... (G of them) in registers as loaded,
// so that the row is read once, all its loads are in flight before the
// first is used, and the sum of squares takes warp shuffles only. The
// values are k_rmsnorm8's: the same roundings, the float64 sums in another
// order. k_rmsnorm8 (a block per row, a block reduction, the row read
// twice) moved about 1.5 TB/s as the 3B step's norm1: 201 MB a layer in
// 131 µs of a timeline span (bench/results/2026-11-27-h100-gemm-add/,
// call 2).

// pack8 rounds 8 floats to dtype DT and packs them.
template <int DT>
__device__ __forceinline__ uint4 pack8(const float* v) {
  u32 w[4];
#pragma unroll
  for (int k = 0; k < 4; k++)
    w[k] = DT == DT_BF16 ? f2bf2(v[2 * k], v[2 * k + 1]) : (u32)f2h(v[2 * k]) | ((u32)f2h(v[2 * k + 1]) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// rmsnorm_r normalises the float32 rows of x into dst, warps grid-striding
// over the rows. x and dst are apart (their dtypes differ).
template <int DT, int G>
__device__ __forceinline__ void rmsnorm_r(uint4* dst, float* rstd, const float4* x, const uint4* w, i64 rows, i64 h,
                                          float eps) {
  int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  i64 ng = h / 8;
  for (i64 r = (i64)blockIdx.x * nw + (threadIdx.x >> 5); r < rows; r += (i64)gridDim.x * nw) {
    float4 xa[G][2];
#pragma unroll
    for (int i = 0; i < G; i++) {
      i64 g = lane + 32 * i;
      if (g < ng) {
        xa[i][0] = x[2 * (r * ng + g)];
        xa[i][1] = x[2 * (r * ng + g) + 1];
      }
    }
    double ss = 0.0;
#pragma unroll
    for (int i = 0; i < G; i++) {
      if (lane + 32 * i < ng) {
        float v[8] = {xa[i][0].x, xa[i][0].y, xa[i][0].z, xa[i][0].w, xa[i][1].x, xa[i][1].y, xa[i][1].z, xa[i][1].w};
#pragma unroll
        for (int k = 0; k < 8; k++) ss += (double)v[k] * (double)v[k];
      }
    }
    ss = warp_sum_d(ss);
    float rv = rms_rstd(ss, h, eps);
    if (lane == 0) rstd[r] = rv;
#pragma unroll
    for (int i = 0; i < G; i++) {
      i64 g = lane + 32 * i;
      if (g < ng) {
        float v[8] = {xa[i][0].x, xa[i][0].y, xa[i][0].z, xa[i][0].w, xa[i][1].x, xa[i][1].y, xa[i][1].z, xa[i][1].w};
        float wv[8];
        ld8(w, DT, g * 8, wv);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = wv[k] * (v[k] * rv);
        dst[r * ng + g] = pack8<DT>(v);
      }
    }
  }
}

#define RMS_R_ARGS uint4 *dst, float *rstd, const float4 *x, const uint4 *w, i64 rows, i64 h, float eps
extern "C" __global__ void __launch_bounds__(256) k_rmsnorm_r4_bf16(RMS_R_ARGS) {
  rmsnorm_r<DT_BF16, 4>(dst, rstd, x, w, rows, h, eps);
}
extern "C" __global__ void __launch_bounds__(256) k_rmsnorm_r8_bf16(RMS_R_ARGS) {
  rmsnorm_r<DT_BF16, 8>(dst, rstd, x, w, rows, h, eps);
}
extern "C" __global__ void __launch_bounds__(256) k_rmsnorm_r16_bf16(RMS_R_ARGS) {
  rmsnorm_r<DT_BF16, 16>(dst, rstd, x, w, rows, h, eps);
}
extern "C" __global__ void __launch_bounds__(256) k_rmsnorm_r4_f16(RMS_R_ARGS) {
  rmsnorm_r<DT_F16, 4>(dst, rstd, x, w, rows, h, eps);
}
extern "C" __global__ void __launch_bounds__(256) k_rmsnorm_r8_f16(RMS_R_ARGS) {
  rmsnorm_r<DT_F16, 8>(dst, rstd, x, w, rows, h, eps);
}
extern "C" __global__ void __launch_bounds__(256) k_rmsnorm_r16_f16(RMS_R_ARGS) {
  rmsnorm_r<DT_F16, 16>(dst, rstd, x, w, rows, h, eps);
}

// rmsnorm_bwd8 is RMSNorm's backward over the rows [b*rpb, (b+1)*rpb) of
// block b. Thread t owns the K column groups t + k*blockDim.x and holds
// their weights. A row's arithmetic is float32 except its dot product's sum
// over the block, which adds the threads' float32 sums of 8K products in
// float64; when partial is not null, each thread also sums dy*x*rstd of
// its columns over the block's rows in float32 and writes them at the end,
// as float64, to partial[b*h + column]. (The kernel did every element's
// arithmetic in float64, with its conversions, and took three barriers a
// row: on an H200 the plain backward of 8192 bf16 rows of 1536 took 77 µs
// that way and 42 this way, the decoder's fused add at the 3B shape 188
// and 176; BenchmarkOps' rmsnorm_bwd rows, the two changes measured
// together, bench/results/2026-11-28-epilogue/.)
//
// Each thread reads its dy before writing dx, so dx may be dy. With addto
// (float32 [rows,h]) not null, dx rounded to dtdx is added into it instead
// of written, and with cast not null the updated sum is also stored there
// in dtc: the values of the backward into dx, an add of dx into addto and
// a cast of the sum (RMSNormBackwardAdd).
//
// The row's sum takes one barrier: each warp's sum goes to one of two
// shared arrays by row parity, and every warp adds the array in the same
// order, so all threads have the same bits. A warp can write a row's array
// again only after every warp has passed the next row's barrier, that is,
// after it read the array.
//
// With AHEAD (the fused add's one-group kernel, k_rmsnorm_bwd8_1a), a
// row's loads (x, dy, addto and its rstd) are issued together, before its
// reduction, and the next row's before this row's work, so that a block
// has two rows' reads in flight instead of waiting on each row's loads in
// turn (rows are disjoint: reading row r+1 before writing row r changes
// nothing). The second row's registers cost occupancy, which the plain
// backward of 16-bit rows felt (BenchmarkOps, 8192 rows of 1536 with dw:
// 124 µs against 79 on an H200); the others load a row as they reach it,
// and addto after the reduction.
template <int K>
struct normRow {
  float x[K][8], g[K][8], a[K][8];
  float rv;
};

template <int K, bool AHEAD>
__device__ __forceinline__ void norm_row_load(normRow<K>& o, const void* dy, int dtdy, const void* x, int dtx,
                                              const float* rstd, const float* addto, i64 r, i64 h, i64 ng) {
  o.rv = rstd[r];
#pragma unroll
  for (int k = 0; k < K; k++) {
    i64 g = threadIdx.x + (i64)k * blockDim.x;
    if (g < ng) {
      ld8(x, dtx, r * h + g * 8, o.x[k]);
      ld8(dy, dtdy, r * h + g * 8, o.g[k]);
      if (AHEAD && addto != 0) ld8(addto, DT_F32, r * h + g * 8, o.a[k]);
    }
  }
}

template <int K, bool AHEAD>
__device__ void rmsnorm_bwd8(void* dx, int dtdx, const void* dy, int dtdy, const void* x, int dtx, const void* w,
                             int dtw, const float* rstd, i64 rows, i64 h, i64 rpb, double* partial, float* addto,
                             void* cast, int dtc) {
  __shared__ double sh[2][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  i64 ng = h / 8;
  float wf[K][8], acc[K][8];
#pragma unroll
  for (int k = 0; k < K; k++) {
    i64 g = threadIdx.x + (i64)k * blockDim.x;
    if (g < ng) ld8(w, dtw, g * 8, wf[k]);
#pragma unroll
    for (int e = 0; e < 8; e++) acc[k][e] = 0.0f;
  }
  i64 r0 = (i64)blockIdx.x * rpb, r1 = min(rows, r0 + rpb);
  normRow<K> cur, nxt;
  if (AHEAD && r0 < r1) norm_row_load<K, AHEAD>(cur, dy, dtdy, x, dtx, rstd, addto, r0, h, ng);
  for (i64 r = r0; r < r1; r++) {
    if (AHEAD && r + 1 < r1) norm_row_load<K, AHEAD>(nxt, dy, dtdy, x, dtx, rstd, addto, r + 1, h, ng);
    if (!AHEAD) norm_row_load<K, AHEAD>(cur, dy, dtdy, x, dtx, rstd, addto, r, h, ng);
    float rv = cur.rv, dot = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++) {
      i64 g = threadIdx.x + (i64)k * blockDim.x;
      if (g < ng) {
#pragma unroll
        for (int e = 0; e < 8; e++) {
          float xn = cur.x[k][e] * rv;
          dot = fmaf(cur.g[k][e] * wf[k][e], xn, dot);
          acc[k][e] = fmaf(cur.g[k][e], xn, acc[k][e]);
        }
      }
    }
    double (*s)[32] = &sh[(r - r0) & 1];
    double ws = warp_sum_d((double)dot);
    if (lane == 0) (*s)[warp] = ws;
    __syncthreads();
    double bs = warp_sum_d(lane < nw ? (*s)[lane] : 0.0);
    float dm = h > 0 ? (float)(bs / (double)h) : 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++) {
      i64 g = threadIdx.x + (i64)k * blockDim.x;
      if (g < ng) {
        float o[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
          float xn = cur.x[k][e] * rv;
          o[e] = rv * (cur.g[k][e] * wf[k][e] - xn * dm);
        }
        if (addto == 0) {
          st8(dx, dtdx, r * h + g * 8, o);
          continue;
        }
        if (!AHEAD) ld8(addto, DT_F32, r * h + g * 8, cur.a[k]);
        float a[8];
#pragma unroll
        for (int e = 0; e < 8; e++) a[e] = cur.a[k][e] + rnd(dtdx, o[e]);
        st8(addto, DT_F32, r * h + g * 8, a);
        if (cast != 0) st8(cast, dtc, r * h + g * 8, a);
      }
    }
    if (AHEAD) cur = nxt;
  }
  if (partial == 0) return;
#pragma unroll
  for (int k = 0; k < K; k++) {
    i64 g = threadIdx.x + (i64)k * blockDim.x;
    if (g < ng)
#pragma unroll
      for (int e = 0; e < 8; e++) partial[(i64)blockIdx.x * h + g * 8 + e] = (double)acc[k][e];
  }
}

extern "C" __global__ void __launch_bounds__(512) k_rmsnorm_bwd8_1(void* dx, int dtdx, const void* dy, int dtdy,
                                                                   const void* x, int dtx, const void* w, int dtw,
                                                                   const float* rstd, i64 rows, i64 h, i64 rpb,
                                                                   double* partial, float* addto, void* cast, int dtc) {
  rmsnorm_bwd8<1, false>(dx, dtdx, dy, dtdy, x, dtx, w, dtw, rstd, rows, h, rpb, partial, addto, cast, dtc);
}

extern "C" __global__ void __launch_bounds__(512) k_rmsnorm_bwd8_1a(void* dx, int dtdx, const void* dy, int dtdy,
                                                                    const void* x, int dtx, const void* w, int dtw,
                                                                    const float* rstd, i64 rows, i64 h, i64 rpb,
                                                                    double* partial, float* addto, void* cast,
                                                                    int dtc) {
  rmsnorm_bwd8<1, true>(dx, dtdx, dy, dtdy, x, dtx, w, dtw, rstd, rows, h, rpb, partial, addto, cast, dtc);
}

extern "C" __global__ void __launch_bounds__(512) k_rmsnorm_bwd8_2(void* dx, int dtdx, const void* dy, int dtdy,
                                                                   const void* x, int dtx, const void* w, int dtw,
                                                                   const float* rstd, i64 rows, i64 h, i64 rpb,
                                                                   double* partial, float* addto, void* cast, int dtc) {
  rmsnorm_bwd8<2, false>(dx, dtdx, dy, dtdy, x, dtx, w, dtw, rstd, rows, h, rpb, partial, addto, cast, dtc);
}

// The *_w kernels are the 8-wide RMSNorm kernels for short rows (at most
// 32 column groups, h <= 256, as in Qwen3's per-head q/k norms): one warp
// per row, lane l owning column group l, reductions by warp shuffles, so a
// block of 8 warps works on 8 rows at once without block barriers per row.

// k_rmsnorm8_w: warps grid-stride over the rows.
extern "C" __global__ void __launch_bounds__(256) k_rmsnorm8_w(void* dst, int dtd, float* rstd, const void* x, int dtx,
                                                               const void* w, int dtw, i64 rows, i64 h, float eps) {
  int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  i64 ng = h / 8;
  bool own = lane < ng;
  float wv[8];
  if (own) ld8(w, dtw, (i64)lane * 8, wv);
  for (i64 r = (i64)blockIdx.x * nw + (threadIdx.x >> 5); r < rows; r += (i64)gridDim.x * nw) {
    float v[8];
    double ss = 0.0;
    if (own) {
      ld8(x, dtx, r * h + lane * 8, v);
#pragma unroll
      for (int k = 0; k < 8; k++) ss += (double)v[k] * (double)v[k];
    }
    ss = warp_sum_d(ss);
    float rv = rms_rstd(ss, h, eps);
    if (lane == 0) rstd[r] = rv;
    if (own) {
#pragma unroll
      for (int k = 0; k < 8; k++) v[k] = wv[k] * rnd(dtx, v[k] * rv);
      st8(dst, dtd, r * h + lane * 8, v);
    }
  }
}

// k_rmsnorm_bwd8_w is rmsnorm_bwd8 for short rows: block b takes the rows
// [b*rpb, (b+1)*rpb), its warp w the rows r0+w, r0+w+nw, ...; each lane
// keeps float64 dw sums of its column group, and the block adds its warps'
// sums in warp order (shared memory) into partial[b*h + column].
extern "C" __global__ void __launch_bounds__(256) k_rmsnorm_bwd8_w(void* dx, int dtdx, const void* dy, int dtdy,
                                                                   const void* x, int dtx, const void* w, int dtw,
                                                                   const float* rstd, i64 rows, i64 h, i64 rpb,
                                                                   double* partial) {
  __shared__ double sh[8][256];
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  i64 ng = h / 8;
  bool own = lane < ng;
  float wf[8];
  double acc[8];
#pragma unroll
  for (int e = 0; e < 8; e++) acc[e] = 0.0;
  if (own) ld8(w, dtw, (i64)lane * 8, wf);
  i64 r0 = (i64)blockIdx.x * rpb, r1 = min(rows, r0 + rpb);
  for (i64 r = r0 + wp; r < r1; r += nw) {
    double rv = (double)rstd[r];
    float xv[8], gv[8];
    double dot = 0.0;
    if (own) {
      ld8(x, dtx, r * h + lane * 8, xv);
      ld8(dy, dtdy, r * h + lane * 8, gv);
#pragma unroll
      for (int e = 0; e < 8; e++) {
        double xn = (double)xv[e] * rv;
        double gw = (double)gv[e] * (double)wf[e];
        dot += gw * xn;
        acc[e] += (double)gv[e] * xn;
      }
    }
    dot = warp_sum_d(dot);
    if (h > 0) dot /= (double)h;
    if (own) {
      float o[8];
#pragma unroll
      for (int e = 0; e < 8; e++) {
        double xn = (double)xv[e] * rv;
        double gw = (double)gv[e] * (double)wf[e];
        o[e] = (float)(rv * (gw - xn * dot));
      }
      st8(dx, dtdx, r * h + lane * 8, o);
    }
  }
  if (partial == 0) return;
  if (own)
#pragma unroll
    for (int e = 0; e < 8; e++) sh[wp][lane * 8 + e] = acc[e];
  __syncthreads();
  for (i64 c = threadIdx.x; c < h; c += blockDim.x) {
    double t = 0.0;
    for (int k = 0; k < nw; k++) t += sh[k][c];
    partial[(i64)blockIdx.x * h + c] = t;
  }
}

// k_rmsnorm_dw_reduce adds the nb per-block partial sums of each column of
// partial [nb,h] in a fixed order and accumulates them into dw:
// dw = float(double(dw) + sum). BiasGrad uses it too, after
// k_colsum8_part. Block (32,8): 32 columns, 8 lanes over the
// partials reduced in a fixed order.
extern "C" __global__ void k_rmsnorm_dw_reduce(void* dw, int dtdw, const double* partial, i64 nb, i64 h) {
  __shared__ double sh[8][33];
  i64 col = (i64)blockIdx.x * 32 + threadIdx.x;
  double s = 0.0;
  if (col < h)
    for (i64 b = threadIdx.y; b < nb; b += 8) s += partial[b * h + col];
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < h) {
    double t = 0.0;
    for (int k = 0; k < 8; k++) t += sh[k][threadIdx.x];
    stf(dw, dtdw, col, (float)((double)ldf(dw, dtdw, col) + t));
  }
}

// k_rope rotates x [rows,heads,d] in place, one block per token, its cos
// and sin computed once per token (rope_cs).
extern "C" __global__ void k_rope(void* x, int dt, const int* pos, i64 rows, int heads, int d, InvFreq inv,
                                  int backward) {
  __shared__ float cs[256], sn[256];
  int half = d / 2;
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    float p = (float)pos[r];
    for (int i = threadIdx.x; i < half; i += blockDim.x) rope_cs(p, inv.v[i], dt, backward, &cs[i], &sn[i]);
    __syncthreads();
    for (int e = threadIdx.x; e < heads * half; e += blockDim.x) {
      int hd = e / half, i = e - hd * half;
      i64 off = (r * heads + hd) * (i64)d;
      float y1, y2;
      rope_pair(dt, ldf(x, dt, off + i), ldf(x, dt, off + i + half), cs[i], sn[i], &y1, &y2);
      stf(x, dt, off + i, y1);
      stf(x, dt, off + i + half, y2);
    }
    __syncthreads();
  }
}

// rope_table fills cs and sn (the block's threads together) with the cos
// and sin (rope_cs) of the tb tokens from r0 that exist, half entries each.
__device__ __forceinline__ void rope_table(float* cs, float* sn, const int* pos, i64 r0, i64 rows, int tb, int half,
                                           const InvFreq& inv, int dt, int backward) {
  for (int e = threadIdx.x; e < tb * half; e += blockDim.x) {
    int k = e / half, i = e - k * half;
    i64 r = r0 + k;
    if (r < rows) rope_cs((float)pos[r], inv.v[i], dt, backward, &cs[e], &sn[e]);
  }
}

// k_rope8 is k_rope, value for value, for head dims that are multiples of 16
// on a 16-byte-aligned x: each block takes tb tokens (grid-striding), first
// computing their cos and sin into shared memory (tb·d/2 ≤ 4096 entries),
// then rotating 8 pairs a thread with 16-byte loads and stores. k_rope's
// block per token of 128 threads, 2-byte accesses and a barrier per token
// ran at a third of the memory's speed.
extern "C" __global__ void k_rope8(void* x, int dt, const int* pos, i64 rows, int heads, int d, InvFreq inv,
                                   int backward, int tb) {
  extern __shared__ float rope_sm[];  // cos then sin of tb tokens: 2·tb·d/2 floats
  int half = d / 2, ng = half / 8, per = heads * ng;
  float *cs = rope_sm, *sn = rope_sm + tb * half;
  for (i64 r0 = (i64)blockIdx.x * tb; r0 < rows; r0 += (i64)gridDim.x * tb) {
    rope_table(cs, sn, pos, r0, rows, tb, half, inv, dt, backward);
    __syncthreads();
    for (int e = threadIdx.x; e < tb * per; e += blockDim.x) {
      int k = e / per, rem = e - k * per;
      int hd = rem / ng, g = rem - hd * ng;
      i64 r = r0 + k;
      if (r >= rows) continue;
      i64 off = (r * heads + hd) * (i64)d + g * 8;
      float x1[8], x2[8], y1[8], y2[8];
      ld8(x, dt, off, x1);
      ld8(x, dt, off + half, x2);
      const float* c = cs + k * half + g * 8;
      const float* s = sn + k * half + g * 8;
#pragma unroll
      for (int j = 0; j < 8; j++) rope_pair(dt, x1[j], x2[j], c[j], s[j], &y1[j], &y2[j]);
      st8(x, dt, off, y1);
      st8(x, dt, off + half, y2);
    }
    __syncthreads();
  }
}

// qkv_cols moves a token's q, k and v between the fused projection's row
// pk[r] ((hq+2·hkv)·d columns: q's, k's, v's) and the tensors a [rows,hq,d],
// b and c [rows,hkv,d], W elements (8, or 1 for any alignment) a thread.
// With PACK false (QKVSplit) it reads pk, adds bias (when hasb) rounded
// to dt as AddBias does, rotates q and k by RoPE and writes a, b, c; with
// PACK true (QKVPack) it reads a and b rotated back, and c, into pk. The
// cos and sin of the tb tokens from r0 are in cs and sn (rope_cs). DTC,
// when not 0, is dt (and the bias's dtype) known at compile time: the
// 16-bit kernels then carry no dtype branches, which had left them
// instruction-bound at a third of the memory's speed.
template <int W, bool PACK, int DTC>
__device__ __forceinline__ void qkv_cols(void* __restrict__ pk, void* __restrict__ a, void* __restrict__ b,
                                         void* __restrict__ c, const void* __restrict__ bias, int dtb, int hasb,
                                         int dt, i64 r0, i64 rows, int hq, int hkv, int d, int tb,
                                         const float* cs, const float* sn) {
  if (DTC) dt = DTC, dtb = DTC;
  int half = d / 2, ng = half / W, nrot = (hq + hkv) * ng, per = nrot + hkv * d / W;
  int lg = __ffs(ng) - 1;
  bool pow2 = (ng & (ng - 1)) == 0;
  i64 wd = (i64)(hq + 2 * hkv) * d;
  // e walks the block's tb·per items; kk and rem (e's token and item in
  // it) follow by subtraction, without a division per item.
  int kk = threadIdx.x / per, rem = threadIdx.x - kk * per;
  for (int e = threadIdx.x; e < tb * per; e += blockDim.x, rem += blockDim.x) {
    while (rem >= per) rem -= per, kk++;
    i64 r = r0 + kk;
    if (r >= rows) continue;
    float x1[W], x2[W], y1[W], y2[W];
    if (rem < nrot) {
      int hd = pow2 ? rem >> lg : rem / ng, g = rem - hd * ng, col = hd * d + g * W;
      void* u = hd < hq ? a : b;
      i64 uo = hd < hq ? (r * hq + hd) * (i64)d + g * W : (r * hkv + hd - hq) * (i64)d + g * W;
      i64 po = r * wd + col;
      if constexpr (PACK) {
        if constexpr (W == 8) ld8(u, dt, uo, x1), ld8(u, dt, uo + half, x2);
        else x1[0] = ldf(u, dt, uo), x2[0] = ldf(u, dt, uo + half);
      } else {
        if constexpr (W == 8) ld8(pk, dt, po, x1), ld8(pk, dt, po + half, x2);
        else x1[0] = ldf(pk, dt, po), x2[0] = ldf(pk, dt, po + half);
        if (hasb) {
          float b1[W], b2[W];
          if constexpr (W == 8) ld8(bias, dtb, col, b1), ld8(bias, dtb, col + half, b2);
          else b1[0] = ldf(bias, dtb, col), b2[0] = ldf(bias, dtb, col + half);
#pragma unroll
          for (int j = 0; j < W; j++) x1[j] = rnd(dt, x1[j] + b1[j]), x2[j] = rnd(dt, x2[j] + b2[j]);
        }
      }
      float cc[W], ss[W];
      const float* cp = cs + kk * half + g * W;
      const float* sp = sn + kk * half + g * W;
      if constexpr (W == 8) {
        // 16-byte shared loads: half is a multiple of 8 here, so cp and sp
        // are 32-byte aligned.
        float4 c0 = ((const float4*)cp)[0], c1 = ((const float4*)cp)[1];
        float4 s0 = ((const float4*)sp)[0], s1 = ((const float4*)sp)[1];
        cc[0] = c0.x, cc[1] = c0.y, cc[2] = c0.z, cc[3] = c0.w, cc[4] = c1.x, cc[5] = c1.y, cc[6] = c1.z, cc[7] = c1.w;
        ss[0] = s0.x, ss[1] = s0.y, ss[2] = s0.z, ss[3] = s0.w, ss[4] = s1.x, ss[5] = s1.y, ss[6] = s1.z, ss[7] = s1.w;
      } else {
        cc[0] = cp[0], ss[0] = sp[0];
      }
#pragma unroll
      for (int j = 0; j < W; j++) rope_pair(dt, x1[j], x2[j], cc[j], ss[j], &y1[j], &y2[j]);
      void* dst = PACK ? pk : u;
      i64 o1 = PACK ? po : uo;
      if constexpr (W == 8) st8(dst, dt, o1, y1), st8(dst, dt, o1 + half, y2);
      else stf(dst, dt, o1, y1[0]), stf(dst, dt, o1 + half, y2[0]);
    } else {
      int col = (rem - nrot) * W;
      i64 po = r * wd + (i64)(hq + hkv) * d + col, uo = r * hkv * (i64)d + col;
      const void* src = PACK ? (const void*)c : (const void*)pk;
      i64 so = PACK ? uo : po;
      if constexpr (W == 8) ld8(src, dt, so, x1);
      else x1[0] = ldf(src, dt, so);
      if (!PACK && hasb) {
        float b1[W];
        if constexpr (W == 8) ld8(bias, dtb, (i64)(hq + hkv) * d + col, b1);
        else b1[0] = ldf(bias, dtb, (i64)(hq + hkv) * d + col);
#pragma unroll
        for (int j = 0; j < W; j++) x1[j] = x1[j] + b1[j];
      }
      void* dst = PACK ? pk : c;
      i64 o1 = PACK ? po : uo;
      if constexpr (W == 8) st8(dst, dt, o1, x1);
      else stf(dst, dt, o1, x1[0]);
    }
  }
}

// qkv_run walks the token groups of tb rows of a block (grid-striding),
// computing their cos and sin (backward for PACK) before qkv_cols.
template <int W, bool PACK, int DTC = 0>
__device__ __forceinline__ void qkv_run(void* pk, void* a, void* b, void* c, const void* bias, int dtb, int hasb,
                                        int dt, const int* pos, i64 rows, int hq, int hkv, int d, const InvFreq& inv,
                                        int tb) {
  extern __shared__ float4 qkv_sm4[];  // cos then sin of tb tokens: 2·tb·d/2 floats
  float* qkv_sm = (float*)qkv_sm4;
  if (DTC) dt = DTC;
  int half = d / 2;
  float *cs = qkv_sm, *sn = qkv_sm + tb * half;
  for (i64 r0 = (i64)blockIdx.x * tb; r0 < rows; r0 += (i64)gridDim.x * tb) {
    rope_table(cs, sn, pos, r0, rows, tb, half, inv, dt, PACK);
    __syncthreads();
    qkv_cols<W, PACK, DTC>(pk, a, b, c, bias, dtb, hasb, dt, r0, rows, hq, hkv, d, tb, cs, sn);
    __syncthreads();
  }
}

// k_qkv_split8 and k_qkv_split are QKVSplit (8 elements a thread with
// 16-byte accesses, or one): q, k, v from the fused projection qkv;
// k_qkv_split8_bf16 and k_qkv_split8_f16 are k_qkv_split8 for 16-bit q,
// k, v, qkv and bias (or none) of that dtype.
extern "C" __global__ void k_qkv_split8(void* q, void* k, void* v, const void* qkv, const void* bias, int dtb,
                                        int hasb, int dt, const int* pos, i64 rows, int hq, int hkv, int d,
                                        InvFreq inv, int tb) {
  qkv_run<8, false>((void*)qkv, q, k, v, bias, dtb, hasb, dt, pos, rows, hq, hkv, d, inv, tb);
}
extern "C" __global__ void k_qkv_split8_bf16(void* q, void* k, void* v, const void* qkv, const void* bias, int dtb,
                                             int hasb, int dt, const int* pos, i64 rows, int hq, int hkv, int d,
                                             InvFreq inv, int tb) {
  qkv_run<8, false, DT_BF16>((void*)qkv, q, k, v, bias, dtb, hasb, dt, pos, rows, hq, hkv, d, inv, tb);
}
extern "C" __global__ void k_qkv_split8_f16(void* q, void* k, void* v, const void* qkv, const void* bias, int dtb,
                                            int hasb, int dt, const int* pos, i64 rows, int hq, int hkv, int d,
                                            InvFreq inv, int tb) {
  qkv_run<8, false, DT_F16>((void*)qkv, q, k, v, bias, dtb, hasb, dt, pos, rows, hq, hkv, d, inv, tb);
}
extern "C" __global__ void k_qkv_split(void* q, void* k, void* v, const void* qkv, const void* bias, int dtb,
                                       int hasb, int dt, const int* pos, i64 rows, int hq, int hkv, int d,
                                       InvFreq inv, int tb) {
  qkv_run<1, false>((void*)qkv, q, k, v, bias, dtb, hasb, dt, pos, rows, hq, hkv, d, inv, tb);
}
// k_qkv_pack8 and k_qkv_pack are QKVPack: dqkv from dq and dk rotated back
// and dv (which they leave as they are); k_qkv_pack8_bf16 and
// k_qkv_pack8_f16 are k_qkv_pack8 for that dtype.
extern "C" __global__ void k_qkv_pack8(void* dqkv, void* dq, void* dk, void* dv, const int* pos, int dt, i64 rows,
                                       int hq, int hkv, int d, InvFreq inv, int tb) {
  qkv_run<8, true>(dqkv, dq, dk, dv, 0, dt, 0, dt, pos, rows, hq, hkv, d, inv, tb);
}
extern "C" __global__ void k_qkv_pack8_bf16(void* dqkv, void* dq, void* dk, void* dv, const int* pos, int dt,
                                            i64 rows, int hq, int hkv, int d, InvFreq inv, int tb) {
  qkv_run<8, true, DT_BF16>(dqkv, dq, dk, dv, 0, dt, 0, dt, pos, rows, hq, hkv, d, inv, tb);
}
extern "C" __global__ void k_qkv_pack8_f16(void* dqkv, void* dq, void* dk, void* dv, const int* pos, int dt,
                                           i64 rows, int hq, int hkv, int d, InvFreq inv, int tb) {
  qkv_run<8, true, DT_F16>(dqkv, dq, dk, dv, 0, dt, 0, dt, pos, rows, hq, hkv, d, inv, tb);
}
extern "C" __global__ void k_qkv_pack(void* dqkv, void* dq, void* dk, void* dv, const int* pos, int dt, i64 rows,
                                      int hq, int hkv, int d, InvFreq inv, int tb) {
  qkv_run<1, true>(dqkv, dq, dk, dv, 0, dt, 0, dt, pos, rows, hq, hkv, d, inv, tb);
}

// k_embedding gathers dst[t] = table[ids[t]], one block per token. An id
// outside [0,v) zero-fills its row and raises FLAG_EMBEDDING_IDS.
extern "C" __global__ void k_embedding(void* dst, int dtd, const void* table, int dtt, const int* ids, i64 rows,
                                       i64 h, i64 v, int* flag) {
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    int id = ids[r];
    bool ok = id >= 0 && id < v;
    if (!ok && threadIdx.x == 0) atomicOr(flag, FLAG_EMBEDDING_IDS);
    for (i64 j = threadIdx.x; j < h; j += blockDim.x)
      stf(dst, dtd, r * h + j, ok ? ldf(table, dtt, (i64)id * h + j) : 0.0f);
  }
}

// k_copy_rows copies dst[rows[j]] = src[rows[j]], rows of w 16-byte words
// (the caller has checked the alignment), one block per listed row; either
// side may be pinned host memory, which a row's contiguous stores cross
// PCIe as full lines. A row outside [0,v) is skipped and raises
// FLAG_COPY_ROWS.
extern "C" __global__ void k_copy_rows(uint4* dst, const uint4* src, const int* rows, i64 n, i64 w, i64 v, int* flag) {
  for (i64 j = blockIdx.x; j < n; j += gridDim.x) {
    int r = rows[j];
    if (r < 0 || r >= v) {
      if (threadIdx.x == 0) atomicOr(flag, FLAG_COPY_ROWS);
      continue;
    }
    const uint4* s = src + (i64)r * w;
    uint4* d = dst + (i64)r * w;
    for (i64 k = threadIdx.x; k < w; k += blockDim.x) d[k] = s[k];
  }
}

// k_copy_rows_b is k_copy_rows for rows of w bytes at any alignment.
extern "C" __global__ void k_copy_rows_b(unsigned char* dst, const unsigned char* src, const int* rows, i64 n, i64 w, i64 v,
                                         int* flag) {
  for (i64 j = blockIdx.x; j < n; j += gridDim.x) {
    int r = rows[j];
    if (r < 0 || r >= v) {
      if (threadIdx.x == 0) atomicOr(flag, FLAG_COPY_ROWS);
      continue;
    }
    for (i64 k = threadIdx.x; k < w; k += blockDim.x) dst[(i64)r * w + k] = src[(i64)r * w + k];
  }
}

// The embedding backward accumulates dTable[ids[t]] += dY[t] with one thread
// per column walking the tokens in order, so repeated ids add in token order
// and each sum is rounded to dTable's dtype exactly as the CPU backend does
// (deterministic, no atomics). Tokens go in groups of EMB_G: when the
// group's ids are distinct its read-modify-writes are independent and
// issued together; otherwise they run one by one.
#define EMB_G 8

// k_embedding_bwd_b splits the ids into nb buckets (id mod nb), block y of
// the grid's second dimension taking bucket y: each id's sums stay in token
// order, on nb times as many blocks. Each block walks
// the tokens in spans of 8·blockDim.x: every thread tests 8 consecutive
// tokens, a prefix sum over the block lists the span's tokens of the bucket
// in token order in shared memory, and the threads (one per column) add
// them in that order, EMB_G at a time when their ids are distinct. One
// block per 128 columns and no buckets left an H100 nearly idle (12 blocks
// for a hidden size of 1536, 90 GB/s). Invalid ids are skipped by every block
// and flagged by block (0,0). blockDim.x is 128 (spans of 1024 tokens).
extern "C" __global__ void k_embedding_bwd_b(void* dt, int dtt, const void* dy, int dtdy, const int* ids, i64 rows,
                                             i64 h, i64 v, int nb, int* flag) {
  __shared__ int list[1024];
  __shared__ int wsum[32];
  i64 col = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  i64 span = 8 * (i64)blockDim.x;
  for (i64 s0 = 0; s0 < rows; s0 += span) {
    unsigned m = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      i64 r = s0 + (i64)threadIdx.x * 8 + k;
      if (r < rows) {
        int id = ids[r];
        if (id < 0 || id >= v) {
          if (blockIdx.x == 0 && blockIdx.y == 0) atomicOr(flag, FLAG_EMBEDDING_BWD_IDS);
        } else if (id % nb == (int)blockIdx.y) {
          m |= 1u << k;
        }
      }
    }
    int c = __popc(m), inc = c;
    for (int o = 1; o < 32; o <<= 1) {
      int y = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += y;
    }
    if (lane == 31) wsum[w] = inc;
    __syncthreads();
    int pos = inc - c, total = 0;
    for (int k = 0; k < nw; k++) {
      if (k < w) pos += wsum[k];
      total += wsum[k];
    }
    for (int k = 0; k < 8; k++)
      if (m & (1u << k)) list[pos++] = threadIdx.x * 8 + k;
    __syncthreads();
    if (col < h) {
      for (int j0 = 0; j0 < total; j0 += EMB_G) {
        int n = min(EMB_G, total - j0);
        int id[EMB_G];
        float g[EMB_G];
        bool distinct = n == EMB_G;
#pragma unroll
        for (int k = 0; k < EMB_G; k++) {
          i64 r = k < n ? s0 + list[j0 + k] : 0;
          id[k] = k < n ? ids[r] : -1 - k;
          g[k] = k < n ? ldf(dy, dtdy, r * h + col) : 0.0f;
        }
#pragma unroll
        for (int a = 0; a < EMB_G; a++)
#pragma unroll
          for (int b = a + 1; b < EMB_G; b++)
            if (id[a] == id[b]) distinct = false;
        if (distinct) {
          float cur[EMB_G];
#pragma unroll
          for (int k = 0; k < EMB_G; k++) cur[k] = ldf(dt, dtt, (i64)id[k] * h + col);
#pragma unroll
          for (int k = 0; k < EMB_G; k++) stf(dt, dtt, (i64)id[k] * h + col, cur[k] + g[k]);
          continue;
        }
        for (int k = 0; k < n; k++) {
          i64 o = (i64)id[k] * h + col;
          stf(dt, dtt, o, ldf(dt, dtt, o) + g[k]);
        }
      }
    }
    __syncthreads();
  }
}
