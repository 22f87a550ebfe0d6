// Causal varlen grouped-query attention, forward and backward, as SIMT
// kernels with an online softmax (O(T) memory; tensor cores are a later
// optimisation). q [T,Hq,D], k and v [T,Hkv,D], cu [S+1] sequence offsets.
// Head dims up to MAXD. Shared memory is dynamic and sized from D by the
// host. Rows are padded by one float where lanes walk rows, so that the
// 32 lanes of a warp hit 32 different banks.

#define MAXD 256
#define DPL (MAXD / 32)
#define FBQ 16  // query rows per forward / dq block (4 warps x 4 rows)
#define RPW 4   // rows per warp
#define BK 32   // keys per tile
#define KBQ 32  // query rows per tile in the dk/dv kernel
#define KPW 8   // keys per warp in the dk/dv kernel (4 warps x 8 = BK)

// seq_start returns the first token of the sequence holding token i: cu[s]
// for the largest s with cu[s] <= i, clamped to [0,i] so that malformed
// offsets (reported through the error flag) never index out of bounds.
__device__ __forceinline__ int seq_start(const int* cu, int ns1, int i) {
  int lo = 0, hi = ns1 - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (cu[mid] <= i) lo = mid; else hi = mid - 1;
  }
  int s = cu[lo];
  return s < 0 ? 0 : (s > i ? i : s);
}

// seq_end returns one past the last token of the sequence holding token i.
__device__ __forceinline__ int seq_end(const int* cu, int ns1, int i, int t) {
  int lo = 0, hi = ns1 - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (cu[mid] <= i) lo = mid; else hi = mid - 1;
  }
  int e = lo + 1 < ns1 ? cu[lo + 1] : t;
  return e <= i ? i + 1 : (e > t ? t : e);
}

// k_check_cu validates cu: cu[0] == 0, cu[ns1-1] == t, non-decreasing.
extern "C" __global__ void k_check_cu(const int* cu, int ns1, int t, int* flag) {
  bool bad = false;
  for (int i = threadIdx.x; i < ns1; i += blockDim.x) {
    if (i == 0 && cu[0] != 0) bad = true;
    if (i == ns1 - 1 && cu[i] != t) bad = true;
    if (i > 0 && cu[i] < cu[i - 1]) bad = true;
  }
  if (bad) atomicOr(flag, FLAG_CUSEQLENS);
}

// load_rows converts rows [r0, r0+n) of head h of a [T,H,D] tensor into
// dst with row stride ld, zero-filling rows past t.
__device__ __forceinline__ void load_rows(float* dst, int ld, const void* src, int dt, int r0, int n, int t, int heads,
                                          int h, int d) {
  for (int e = threadIdx.x; e < n * d; e += blockDim.x) {
    int r = e / d, c = e - r * d;
    int i = r0 + r;
    dst[r * ld + c] = i < t ? ldf(src, dt, ((i64)i * heads + h) * d + c) : 0.0f;
  }
}

// k_attn_fwd: block (128 threads) = FBQ query rows of head blockIdx.y; warp w
// owns rows 4w..4w+3; within a key tile lane j scores key j, then every lane
// updates its D/32 output columns.
extern "C" __global__ void __launch_bounds__(128) k_attn_fwd(void* out, int dto, float* lse, const void* q, int dtq,
                                                              const void* k, int dtk, const void* v, int dtv,
                                                              const int* cu, int ns1, int t, int hq, int hkv, int d,
                                                              float scale) {
  extern __shared__ float sm[];
  float* Ks = sm;                  // BK x (d+1)
  float* Vs = Ks + BK * (d + 1);   // BK x d
  float* Qs = Vs + BK * d;         // FBQ x d
  int h = blockIdx.y, hk = h / (hq / hkv);
  int q0 = blockIdx.x * FBQ;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  load_rows(Qs, d, q, dtq, q0, FBQ, t, hq, h, d);
  float m[RPW], l[RPW], acc[RPW][DPL];
  int st[RPW];
#pragma unroll
  for (int rr = 0; rr < RPW; rr++) {
    int i = q0 + warp * RPW + rr;
    m[rr] = -F_INF;
    l[rr] = 0.0f;
    st[rr] = i < t ? seq_start(cu, ns1, i) : 0;
#pragma unroll
    for (int c = 0; c < DPL; c++) acc[rr][c] = 0.0f;
  }
  int kmin = seq_start(cu, ns1, q0 < t ? q0 : t - 1);
  int kmax = min(q0 + FBQ, t) - 1;
  for (int j0 = kmin; j0 <= kmax; j0 += BK) {
    __syncthreads();
    load_rows(Ks, d + 1, k, dtk, j0, BK, t, hkv, hk, d);
    load_rows(Vs, d, v, dtv, j0, BK, t, hkv, hk, d);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
      int r = warp * RPW + rr, i = q0 + r;
      if (i >= t || j0 > i || j0 + BK <= st[rr]) continue;
      int j = j0 + lane;
      bool valid = j >= st[rr] && j <= i;
      float s = -F_INF;
      if (valid) {
        const float* qr = Qs + r * d;
        const float* kr = Ks + lane * (d + 1);
        float dot = 0.0f;
        for (int c = 0; c < d; c++) dot = __fmaf_rn(qr[c], kr[c], dot);
        s = scale * dot;
      }
      float mx = warp_max(s);
      float mnew = fmaxf(m[rr], mx);
      float corr = expf(m[rr] - mnew);
      float p = valid ? expf(s - mnew) : 0.0f;
      l[rr] = l[rr] * corr + warp_sum(p);
#pragma unroll
      for (int c = 0; c < DPL; c++) acc[rr][c] *= corr;
      int jn = min(BK, i - j0 + 1);
      for (int jj = 0; jj < jn; jj++) {
        float pj = __shfl_sync(0xffffffffu, p, jj);
        const float* vr = Vs + jj * d;
#pragma unroll
        for (int c = 0; c < DPL; c++) {
          int col = lane + 32 * c;
          if (col < d) acc[rr][c] = __fmaf_rn(pj, vr[col], acc[rr][c]);
        }
      }
      m[rr] = mnew;
    }
  }
#pragma unroll
  for (int rr = 0; rr < RPW; rr++) {
    int i = q0 + warp * RPW + rr;
    if (i >= t) continue;
    float inv = 1.0f / l[rr];
#pragma unroll
    for (int c = 0; c < DPL; c++) {
      int col = lane + 32 * c;
      if (col < d) stf(out, dto, ((i64)i * hq + h) * d + col, acc[rr][c] * inv);
    }
    if (lane == 0) lse[(i64)h * t + i] = m[rr] + (float)log((double)l[rr]);
  }
}

// k_attn_bwd_dq: same layout as the forward; recomputes p from the saved
// lse and delta = rowsum(dout*out), then dq += ds * K.
extern "C" __global__ void __launch_bounds__(128) k_attn_bwd_dq(void* dq, int dtdq, const void* dout, int dtdo,
                                                                 const void* out, int dto, const float* lse,
                                                                 const void* q, int dtq, const void* k, int dtk,
                                                                 const void* v, int dtv, const int* cu, int ns1, int t,
                                                                 int hq, int hkv, int d, float scale) {
  extern __shared__ float sm[];
  float* Ks = sm;                  // BK x (d+1)
  float* Vs = Ks + BK * (d + 1);   // BK x (d+1)
  float* Qs = Vs + BK * (d + 1);   // FBQ x d
  float* Gs = Qs + FBQ * d;        // FBQ x d (dout)
  int h = blockIdx.y, hk = h / (hq / hkv);
  int q0 = blockIdx.x * FBQ;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  load_rows(Qs, d, q, dtq, q0, FBQ, t, hq, h, d);
  load_rows(Gs, d, dout, dtdo, q0, FBQ, t, hq, h, d);
  __syncthreads();
  float acc[RPW][DPL], L[RPW], delta[RPW];
  int st[RPW];
#pragma unroll
  for (int rr = 0; rr < RPW; rr++) {
    int r = warp * RPW + rr, i = q0 + r;
    float dl = 0.0f;
    if (i < t) {
      for (int c = lane; c < d; c += 32) dl += Gs[r * d + c] * ldf(out, dto, ((i64)i * hq + h) * d + c);
    }
    delta[rr] = warp_sum(dl);
    L[rr] = i < t ? lse[(i64)h * t + i] : 0.0f;
    st[rr] = i < t ? seq_start(cu, ns1, i) : 0;
#pragma unroll
    for (int c = 0; c < DPL; c++) acc[rr][c] = 0.0f;
  }
  int kmin = seq_start(cu, ns1, q0 < t ? q0 : t - 1);
  int kmax = min(q0 + FBQ, t) - 1;
  for (int j0 = kmin; j0 <= kmax; j0 += BK) {
    __syncthreads();
    load_rows(Ks, d + 1, k, dtk, j0, BK, t, hkv, hk, d);
    load_rows(Vs, d + 1, v, dtv, j0, BK, t, hkv, hk, d);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
      int r = warp * RPW + rr, i = q0 + r;
      if (i >= t || j0 > i || j0 + BK <= st[rr]) continue;
      int j = j0 + lane;
      bool valid = j >= st[rr] && j <= i;
      float ds = 0.0f;
      if (valid) {
        const float* qr = Qs + r * d;
        const float* gr = Gs + r * d;
        const float* kr = Ks + lane * (d + 1);
        const float* vr = Vs + lane * (d + 1);
        float s = 0.0f, dp = 0.0f;
        for (int c = 0; c < d; c++) {
          s = __fmaf_rn(qr[c], kr[c], s);
          dp = __fmaf_rn(gr[c], vr[c], dp);
        }
        float p = expf(scale * s - L[rr]);
        ds = scale * p * (dp - delta[rr]);
      }
      int jn = min(BK, i - j0 + 1);
      for (int jj = 0; jj < jn; jj++) {
        float dsj = __shfl_sync(0xffffffffu, ds, jj);
        const float* kr = Ks + jj * (d + 1);
#pragma unroll
        for (int c = 0; c < DPL; c++) {
          int col = lane + 32 * c;
          if (col < d) acc[rr][c] = __fmaf_rn(dsj, kr[col], acc[rr][c]);
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < RPW; rr++) {
    int i = q0 + warp * RPW + rr;
    if (i >= t) continue;
#pragma unroll
    for (int c = 0; c < DPL; c++) {
      int col = lane + 32 * c;
      if (col < d) stf(dq, dtdq, ((i64)i * hq + h) * d + col, acc[rr][c]);
    }
  }
}

// k_attn_bwd_dkv: block (128 threads) = BK keys of kv head blockIdx.y; warp w
// owns keys 8w..8w+7. For every query head of the group and every tile of
// KBQ later query rows, lane i scores query i against one key, then every
// lane adds its D/32 columns of p*dout and ds*q into the shared dk/dv
// accumulators of that key. Sums over the group happen here, so K and V are
// never replicated and no atomics are needed.
extern "C" __global__ void __launch_bounds__(128) k_attn_bwd_dkv(void* dk, int dtdk, void* dv, int dtdv,
                                                                  const void* dout, int dtdo, const void* out, int dto,
                                                                  const float* lse, const void* q, int dtq,
                                                                  const void* k, int dtk, const void* v, int dtv,
                                                                  const int* cu, int ns1, int t, int hq, int hkv,
                                                                  int d, float scale) {
  extern __shared__ float sm[];
  int ld = d + 1;
  float* Ks = sm;              // BK x ld
  float* Vs = Ks + BK * ld;    // BK x ld
  float* Qs = Vs + BK * ld;    // KBQ x ld
  float* Gs = Qs + KBQ * ld;   // KBQ x ld
  float* dKs = Gs + KBQ * ld;  // BK x d
  float* dVs = dKs + BK * d;   // BK x d
  float* Ls = dVs + BK * d;    // KBQ
  float* Ds = Ls + KBQ;        // KBQ
  int* Ss = (int*)(Ds + KBQ);  // KBQ
  int hk = blockIdx.y, group = hq / hkv;
  int k0 = blockIdx.x * BK;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  load_rows(Ks, ld, k, dtk, k0, BK, t, hkv, hk, d);
  load_rows(Vs, ld, v, dtv, k0, BK, t, hkv, hk, d);
  for (int e = threadIdx.x; e < BK * d; e += blockDim.x) {
    dKs[e] = 0.0f;
    dVs[e] = 0.0f;
  }
  int klast = min(k0 + BK, t) - 1;
  int qend = seq_end(cu, ns1, klast, t);
  for (int h = hk * group; h < (hk + 1) * group; h++) {
    for (int i0 = k0; i0 < qend; i0 += KBQ) {
      __syncthreads();
      load_rows(Qs, ld, q, dtq, i0, KBQ, t, hq, h, d);
      load_rows(Gs, ld, dout, dtdo, i0, KBQ, t, hq, h, d);
      __syncthreads();
      // delta and lse of the tile's rows: warp w handles rows 8w..8w+7.
      for (int rr = 0; rr < KBQ / 4; rr++) {
        int r = warp * (KBQ / 4) + rr, i = i0 + r;
        float dl = 0.0f;
        if (i < t)
          for (int c = lane; c < d; c += 32) dl += Gs[r * ld + c] * ldf(out, dto, ((i64)i * hq + h) * d + c);
        dl = warp_sum(dl);
        if (lane == 0) {
          Ds[r] = dl;
          Ls[r] = i < t ? lse[(i64)h * t + i] : 0.0f;
          Ss[r] = i < t ? seq_start(cu, ns1, i) : t;
        }
      }
      __syncthreads();
      int i = i0 + lane;
      for (int kk = 0; kk < KPW; kk++) {
        int kr = warp * KPW + kk, j = k0 + kr;
        if (j >= t) break;
        bool valid = i < t && j <= i && j >= Ss[lane];
        if (!__any_sync(0xffffffffu, valid)) continue;
        float p = 0.0f, ds = 0.0f;
        if (valid) {
          const float* qr = Qs + lane * ld;
          const float* gr = Gs + lane * ld;
          const float* kv = Ks + kr * ld;
          const float* vv = Vs + kr * ld;
          float s = 0.0f, dp = 0.0f;
          for (int c = 0; c < d; c++) {
            s = __fmaf_rn(qr[c], kv[c], s);
            dp = __fmaf_rn(gr[c], vv[c], dp);
          }
          p = expf(scale * s - Ls[lane]);
          ds = scale * p * (dp - Ds[lane]);
        }
        float ak[DPL], av[DPL];
#pragma unroll
        for (int c = 0; c < DPL; c++) {
          ak[c] = 0.0f;
          av[c] = 0.0f;
        }
        for (int ii = 0; ii < KBQ; ii++) {
          float pi = __shfl_sync(0xffffffffu, p, ii);
          float dsi = __shfl_sync(0xffffffffu, ds, ii);
          if (pi == 0.0f && dsi == 0.0f) continue;
          const float* qr = Qs + ii * ld;
          const float* gr = Gs + ii * ld;
#pragma unroll
          for (int c = 0; c < DPL; c++) {
            int col = lane + 32 * c;
            if (col < d) {
              av[c] = __fmaf_rn(pi, gr[col], av[c]);
              ak[c] = __fmaf_rn(dsi, qr[col], ak[c]);
            }
          }
        }
#pragma unroll
        for (int c = 0; c < DPL; c++) {
          int col = lane + 32 * c;
          if (col < d) {
            dKs[kr * d + col] += ak[c];
            dVs[kr * d + col] += av[c];
          }
        }
      }
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < BK * d; e += blockDim.x) {
    int r = e / d, c = e - r * d, j = k0 + r;
    if (j < t) {
      i64 o = ((i64)j * hkv + hk) * d + c;
      stf(dk, dtdk, o, dKs[e]);
      stf(dv, dtdv, o, dVs[e]);
    }
  }
}
