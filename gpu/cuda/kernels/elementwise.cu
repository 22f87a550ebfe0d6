// Elementwise kernels: casts, fills, arithmetic, SwiGLU, bias, AdamW and the
// sum of squares. Operands carry their dtype codes; values are computed in
// float32 (float64 where the CPU reference uses it, but for SwiGLU's
// sigmoid: see sigmoid) and stored rounded to nearest even. Contraction into
// FMA is off (--fmad=false), so float32 expressions round exactly as the CPU
// backend's do.

extern "C" __global__ void k_cast(void* dst, int dtd, const void* src, int dts, i64 n) {
  GRID_STRIDE(i, n) { stf(dst, dtd, i, ldf(src, dts, i)); }
}

extern "C" __global__ void k_fill32(u32* p, i64 n, u32 v) {
  GRID_STRIDE(i, n) { p[i] = v; }
}

extern "C" __global__ void k_fill16(u16* p, i64 n, u32 v) {
  GRID_STRIDE(i, n) { p[i] = (u16)v; }
}

extern "C" __global__ void k_add(void* dst, int dtd, const void* a, int dta, const void* b, int dtb, i64 n) {
  GRID_STRIDE(i, n) { stf(dst, dtd, i, ldf(a, dta, i) + ldf(b, dtb, i)); }
}

extern "C" __global__ void k_scale(void* x, int dt, i64 n, float s) {
  GRID_STRIDE(i, n) { stf(x, dt, i, ldf(x, dt, i) * s); }
}

extern "C" __global__ void k_addscaled(void* dst, int dtd, const void* x, int dtx, i64 n, float s) {
  GRID_STRIDE(i, n) {
    float p = s * ldf(x, dtx, i);
    stf(dst, dtd, i, ldf(dst, dtd, i) + p);
  }
}

extern "C" __global__ void k_swiglu(void* out, int dto, const void* g, int dtg, const void* u, int dtu, i64 n) {
  GRID_STRIDE(i, n) {
    stf(out, dto, i, swiglu1(dtg, ldf(g, dtg, i), ldf(u, dtu, i)));
  }
}

extern "C" __global__ void k_swiglu_bwd(void* dg, int dtdg, void* du, int dtdu, const void* dout, int dtdo,
                                        const void* g, int dtg, const void* u, int dtu, i64 n) {
  GRID_STRIDE(i, n) {
    float dgv, dup;
    dswiglu1(dtg, ldf(dout, dtdo, i), ldf(g, dtg, i), ldf(u, dtu, i), dgv, dup);
    stf(du, dtdu, i, dup);
    stf(dg, dtdg, i, dgv);
  }
}

// The *8 kernels below are the same operations, element for element (so
// their results are bit-identical), on groups of 8 elements with 16-byte
// loads and stores. The Go side uses them when n is a multiple of 8, every
// operand is 16-byte aligned and every dtype is a float dtype.

extern "C" __global__ void k_cast8(void* dst, int dtd, const void* src, int dts, i64 n) {
  GRID_STRIDE8(i, n) {
    float v[8];
    ld8(src, dts, i, v);
    st8(dst, dtd, i, v);
  }
}

extern "C" __global__ void k_add8(void* dst, int dtd, const void* a, int dta, const void* b, int dtb, i64 n) {
  GRID_STRIDE8(i, n) {
    float x[8], y[8];
    ld8(a, dta, i, x);
    ld8(b, dtb, i, y);
#pragma unroll
    for (int k = 0; k < 8; k++) x[k] = x[k] + y[k];
    st8(dst, dtd, i, x);
  }
}

extern "C" __global__ void k_scale8(void* x, int dt, i64 n, float s) {
  GRID_STRIDE8(i, n) {
    float v[8];
    ld8(x, dt, i, v);
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = v[k] * s;
    st8(x, dt, i, v);
  }
}

extern "C" __global__ void k_addscaled8(void* dst, int dtd, const void* x, int dtx, i64 n, float s) {
  GRID_STRIDE8(i, n) {
    float d[8], v[8];
    ld8(x, dtx, i, v);
    ld8(dst, dtd, i, d);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      float p = s * v[k];
      d[k] = d[k] + p;
    }
    st8(dst, dtd, i, d);
  }
}

extern "C" __global__ void k_swiglu8(void* out, int dto, const void* g, int dtg, const void* u, int dtu, i64 n) {
  GRID_STRIDE8(i, n) {
    float x[8], y[8];
    ld8(g, dtg, i, x);
    ld8(u, dtu, i, y);
#pragma unroll
    for (int k = 0; k < 8; k++) x[k] = swiglu1(dtg, x[k], y[k]);
    st8(out, dto, i, x);
  }
}

extern "C" __global__ void k_swiglu_bwd8(void* dg, int dtdg, void* du, int dtdu, const void* dout, int dtdo,
                                         const void* g, int dtg, const void* u, int dtu, i64 n) {
  GRID_STRIDE8(i, n) {
    float d[8], x[8], y[8], gv[8], uv[8];
    ld8(dout, dtdo, i, d);
    ld8(g, dtg, i, x);
    ld8(u, dtu, i, y);
#pragma unroll
    for (int k = 0; k < 8; k++) dswiglu1(dtg, d[k], x[k], y[k], gv[k], uv[k]);
    st8(du, dtdu, i, uv);
    st8(dg, dtdg, i, gv);
  }
}

// k_addbias8 adds b to every row of y [rows,n]; n is a multiple of 8.
extern "C" __global__ void k_addbias8(void* y, int dty, const void* b, int dtb, i64 rows, i64 n) {
  GRID_STRIDE8(i, rows * n) {
    float v[8], w[8];
    ld8(y, dty, i, v);
    ld8(b, dtb, i % n, w);
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = v[k] + w[k];
    st8(y, dty, i, v);
  }
}

extern "C" __global__ void k_addbias(void* y, int dty, const void* b, int dtb, i64 rows, i64 n) {
  GRID_STRIDE(i, rows * n) { stf(y, dty, i, ldf(y, dty, i) + ldf(b, dtb, i % n)); }
}

// k_colsum accumulates the float64 column sums of x [rows,n] into out [n]
// (out = float32(float64(out) + sum)). Block (32,8): 32 columns, 8 row lanes
// reduced in a fixed order.
extern "C" __global__ void k_colsum(void* out, int dto, const void* x, int dtx, i64 rows, i64 n) {
  __shared__ double sh[8][33];
  i64 col = (i64)blockIdx.x * 32 + threadIdx.x;
  double s = 0.0;
  if (col < n)
    for (i64 r = threadIdx.y; r < rows; r += 8) s += (double)ldf(x, dtx, r * n + col);
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    double t = 0.0;
    for (int k = 0; k < 8; k++) t += sh[k][threadIdx.x];
    stf(out, dto, col, (float)((double)ldf(out, dto, col) + t));
  }
}

// k_colsum8_part writes float64 column sums of the rows [y·rpb, (y+1)·rpb)
// of x [rows,n] (n a multiple of 8, x 16-byte aligned) to partial[y·n + col]
// for block row y = blockIdx.y, for k_rmsnorm_dw_reduce to add in a fixed
// order. Block (32,8): 32 groups of 8 columns (blockIdx.x·256 on), 8 row
// lanes, each lane taking every 8th row with four 16-byte loads in flight;
// the lanes are added in a fixed order. k_colsum's one block per 32 columns
// left an H100 nearly idle for the narrow k and v biases (8 blocks for 256
// columns, each thread walking its rows one dependent load at a time).
extern "C" __global__ void k_colsum8_part(double* partial, const void* x, int dtx, i64 rows, i64 n, i64 rpb) {
  __shared__ double sh[8][32][9];
  i64 ng = n / 8, g = (i64)blockIdx.x * 32 + threadIdx.x;
  i64 r0 = (i64)blockIdx.y * rpb, r1 = min(rows, r0 + rpb);
  double s[8];
#pragma unroll
  for (int e = 0; e < 8; e++) s[e] = 0.0;
  if (g < ng) {
    i64 r = r0 + threadIdx.y;
    for (; r + 24 < r1; r += 32) {
      float v[4][8];
#pragma unroll
      for (int u = 0; u < 4; u++) ld8(x, dtx, (r + 8 * u) * n + g * 8, v[u]);
#pragma unroll
      for (int u = 0; u < 4; u++)
#pragma unroll
        for (int e = 0; e < 8; e++) s[e] += (double)v[u][e];
    }
    for (; r < r1; r += 8) {
      float v[8];
      ld8(x, dtx, r * n + g * 8, v);
#pragma unroll
      for (int e = 0; e < 8; e++) s[e] += (double)v[e];
    }
  }
#pragma unroll
  for (int e = 0; e < 8; e++) sh[threadIdx.y][threadIdx.x][e] = s[e];
  __syncthreads();
  if (threadIdx.y == 0 && g < ng) {
#pragma unroll
    for (int e = 0; e < 8; e++) {
      double t = 0.0;
      for (int k = 0; k < 8; k++) t += sh[k][threadIdx.x][e];
      partial[(i64)blockIdx.y * n + g * 8 + e] = t;
    }
  }
}

// adamw1 is one torch.optim.AdamW step of one element in torch's float32
// operation order; the scalar factors were formed in float64 on the host.
// The gradient is read multiplied by gs (the clipping coefficient; 1
// multiplies exactly).
__device__ __forceinline__ void adamw1(float& p, float g, float& m, float& v, float decay, float w1, float b2, float w2,
                                       float stepSize, float bc2sqrt, float eps, float gs) {
  float x = p * decay;
  float gi = g * gs;
  float mo = m;
  float mi;
  if (w1 >= 0.5f) {
    float t = (gi - mo) * (1.0f - w1);
    mi = gi - t;
  } else {
    float t = w1 * (gi - mo);
    mi = mo + t;
  }
  float a = v * b2;
  float c = w2 * gi;
  float vi = a + c * gi;
  float den = sqrtf(vi) / bc2sqrt + eps;
  float st = stepSize * mi;
  x += st / den;
  p = x;
  m = mi;
  v = vi;
}

#define ADAMW_ARGS \
  i64 n, float decay, float w1, float b2, float w2, float stepSize, float bc2sqrt, float eps, float gs
#define ADAMW_CONSTS decay, w1, b2, w2, stepSize, bc2sqrt, eps, gs

// k_adamw is AdamW over n elements, the grads g of dtype dtg (float32 or
// 16-bit, read as float32).
extern "C" __global__ void k_adamw(float* p, const void* g, int dtg, float* m, float* v, ADAMW_ARGS) {
  GRID_STRIDE(i, n) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw1(pi, ldf(g, dtg, i), mi, vi, ADAMW_CONSTS);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

// grads4 reads a group of 4 grads as floats: float4s as they are, uint2s
// as 4 16-bit values of dtype dtg.
__device__ __forceinline__ float4 grads4(float4 g, int) { return g; }
__device__ __forceinline__ float4 grads4(uint2 g, int dtg) {
  u16 h[4] = {(u16)(g.x & 0xffffu), (u16)(g.x >> 16), (u16)(g.y & 0xffffu), (u16)(g.y >> 16)};
  float f[4];
#pragma unroll
  for (int e = 0; e < 4; e++) f[e] = dtg == DT_BF16 ? bf2f(h[e]) : h2f(h[e]);
  return make_float4(f[0], f[1], f[2], f[3]);
}

// adamw4 is k_adamw on float4s (k_adamw4, k_adamw4_16): n counts groups
// of 4, p, m and v 16-byte aligned (the Go side checks); G is a group of 4
// grads: float4 (float32 grads, 16-byte aligned; dtg unused) or uint2
// (16-bit grads of dtype dtg, 8-byte aligned).
template <typename G>
__device__ __forceinline__ void adamw4(float4* p, const G* g, int dtg, float4* m, float4* v, ADAMW_ARGS) {
  GRID_STRIDE(i, n) {
    float4 pp = p[i], gg = grads4(g[i], dtg), mm = m[i], vv = v[i];
    adamw1(pp.x, gg.x, mm.x, vv.x, ADAMW_CONSTS);
    adamw1(pp.y, gg.y, mm.y, vv.y, ADAMW_CONSTS);
    adamw1(pp.z, gg.z, mm.z, vv.z, ADAMW_CONSTS);
    adamw1(pp.w, gg.w, mm.w, vv.w, ADAMW_CONSTS);
    p[i] = pp;
    m[i] = mm;
    v[i] = vv;
  }
}

extern "C" __global__ void k_adamw4(float4* p, const float4* g, int dtg, float4* m, float4* v, ADAMW_ARGS) {
  adamw4(p, g, dtg, m, v, n, ADAMW_CONSTS);
}
extern "C" __global__ void k_adamw4_16(float4* p, const uint2* g, int dtg, float4* m, float4* v, ADAMW_ARGS) {
  adamw4(p, g, dtg, m, v, n, ADAMW_CONSTS);
}

// k_sumsq writes one float64 partial sum of squares per block.
extern "C" __global__ void k_sumsq(const void* x, int dt, i64 n, double* partial) {
  __shared__ double sh[33];
  double s = 0.0;
  GRID_STRIDE(i, n) {
    double v = (double)ldf(x, dt, i);
    s += v * v;
  }
  s = block_sum_d(s, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// k_sumsq8 is k_sumsq with 16-byte loads: each thread takes two
// 8-element groups a turn, a grid-stride apart, into two float64 sums;
// block 0 also takes the n%8 elements after the last whole group. x is
// 16-byte aligned (the Go side checks). The partials are in another order
// than k_sumsq's, fixed by the grid.
extern "C" __global__ void k_sumsq8(const void* x, int dt, i64 n, double* partial) {
  __shared__ double sh[33];
  double s0 = 0.0, s1 = 0.0;
  i64 n8 = n / 8 * 8, stride = (i64)gridDim.x * blockDim.x * 8;
  i64 i = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * 8;
  for (; i + stride < n8; i += 2 * stride) {
    float a[8], b[8];
    ld8(x, dt, i, a);
    ld8(x, dt, i + stride, b);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      s0 += (double)a[k] * (double)a[k];
      s1 += (double)b[k] * (double)b[k];
    }
  }
  if (i < n8) {
    float a[8];
    ld8(x, dt, i, a);
#pragma unroll
    for (int k = 0; k < 8; k++) s0 += (double)a[k] * (double)a[k];
  }
  if (blockIdx.x == 0 && threadIdx.x < n - n8) {
    double t = (double)ldf(x, dt, n8 + threadIdx.x);
    s1 += t * t;
  }
  double s = block_sum_d(s0 + s1, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// k_sum_partials adds n partials in a fixed order into out[0].
extern "C" __global__ void k_sum_partials(const double* partial, int n, double* out) {
  __shared__ double sh[33];
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum_d(s, sh);
  if (threadIdx.x == 0) out[0] = s;
}

// k_spin holds its stream for ns nanoseconds of the GPU's global timer (one
// thread; Backend.Delay).
extern "C" __global__ void k_spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
