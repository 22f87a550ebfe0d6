// Elementwise kernels: casts, fills, arithmetic, SwiGLU, bias, AdamW and the
// sum of squares. Operands carry their dtype codes; values are computed in
// float32 (float64 where the CPU reference uses it) and stored rounded to
// nearest even. Contraction into FMA is off (--fmad=false), so float32
// expressions round exactly as the CPU backend's do.

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

__device__ __forceinline__ float sigmoid(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

extern "C" __global__ void k_swiglu(void* out, int dto, const void* g, int dtg, const void* u, int dtu, i64 n) {
  GRID_STRIDE(i, n) {
    float x = ldf(g, dtg, i);
    float y = ldf(u, dtu, i);
    stf(out, dto, i, rnd(dtg, x * sigmoid(x)) * y);
  }
}

extern "C" __global__ void k_swiglu_bwd(void* dg, int dtdg, void* du, int dtdu, const void* dout, int dtdo,
                                        const void* g, int dtg, const void* u, int dtu, i64 n) {
  GRID_STRIDE(i, n) {
    float d = ldf(dout, dtdo, i);
    float x = ldf(g, dtg, i);
    float y = ldf(u, dtu, i);
    float s = sigmoid(x);
    float dup = d * rnd(dtg, x * s);
    float t = rnd(dtg, d * y);
    float dgv = t * (s * (1.0f + x * (1.0f - s)));
    stf(du, dtdu, i, dup);
    stf(dg, dtdg, i, dgv);
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

// k_adamw is one torch.optim.AdamW step in torch's float32 operation order;
// the scalar factors were formed in float64 on the host.
extern "C" __global__ void k_adamw(float* p, const float* g, float* m, float* v, i64 n, float decay, float w1,
                                   float b2, float w2, float stepSize, float bc2sqrt, float eps) {
  GRID_STRIDE(i, n) {
    float x = p[i] * decay;
    float gi = g[i];
    float mo = m[i];
    float mi;
    if (w1 >= 0.5f) {
      float t = (gi - mo) * (1.0f - w1);
      mi = gi - t;
    } else {
      float t = w1 * (gi - mo);
      mi = mo + t;
    }
    float a = v[i] * b2;
    float c = w2 * gi;
    float vi = a + c * gi;
    float den = sqrtf(vi) / bc2sqrt + eps;
    float st = stepSize * mi;
    x += st / den;
    p[i] = x;
    m[i] = mi;
    v[i] = vi;
  }
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

// k_sum_partials adds n partials in a fixed order into out[0].
extern "C" __global__ void k_sum_partials(const double* partial, int n, double* out) {
  __shared__ double sh[33];
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum_d(s, sh);
  if (threadIdx.x == 0) out[0] = s;
}
