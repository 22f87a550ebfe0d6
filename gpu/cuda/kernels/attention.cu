// Causal varlen grouped-query attention, forward and backward, with an
// online softmax (O(T) memory). q [T,Hq,D], k and v [T,Hkv,D], cu [S+1]
// sequence offsets. Two families: the SIMT kernels k_attn_* (any float
// dtype, exact fp32 arithmetic) and, further down, the tensor-core kernels
// k_fa_* (bf16 and f16, head dims 64 and 128). The SIMT kernels handle
// head dims up to MAXD. Their shared memory is dynamic and sized from D by the
// host. Rows are padded by one float where lanes walk rows, so that the
// 32 lanes of a warp hit 32 different banks.
//
// uses hopper.cuh
//
// The file is compiled as eight modules, each with every eighth kernel
// (kernels.go, splitParts), in parallel: as one it took 43 s of NVRTC on
// an H100 host, the first run's wait on a machine without the kernel cache.
// parts: 8

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

// The SIMT kernels are written once over a range policy R that says which
// keys each query row sees: Causal, the rows of its sequence up to itself;
// Spans (context parallelism's ring attention), the key rows of the span
// holding the query row, none for a row in no span. R gives, for query row
// i, its keys [lo, hi); for a block of query rows, the keys any of them
// sees; for a block of keys, the query rows that may see any of them.
// q, out, dout, dq and lse have tq rows; k, v, dk and dv tk.
struct Causal {
  const int* cu;
  int ns1;
  __device__ __forceinline__ void keys(int i, int tq, int& lo, int& hi) const {
    lo = seq_start(cu, ns1, i);
    hi = i + 1;
  }
  __device__ __forceinline__ void block_keys(int q0, int tq, int& lo, int& hi) const {
    lo = seq_start(cu, ns1, q0 < tq ? q0 : tq - 1);
    hi = min(q0 + FBQ, tq);
  }
  __device__ __forceinline__ void block_queries(int k0, int tk, int& lo, int& hi) const {
    lo = k0;
    hi = seq_end(cu, ns1, min(k0 + BK, tk) - 1, tk);
  }
};

// Spans holds, for query row i, its keys [qk[2i], qk[2i+1]) and, for key
// row j, the query rows [kq[2j], kq[2j+1]) that see it (empty ranges for
// rows in no span); the host builds both from the spans.
struct Spans {
  const int* qk;
  const int* kq;
  __device__ __forceinline__ void keys(int i, int tq, int& lo, int& hi) const {
    lo = qk[2 * i];
    hi = qk[2 * i + 1];
  }
  // span_union is the union [lo, hi) of the non-empty ranges r[2i],
  // r[2i+1] of rows i in [i0, i1); lo > hi when all are empty.
  __device__ __forceinline__ static void span_union(const int* r, int i0, int i1, int& lo, int& hi) {
    lo = 0x7fffffff;
    hi = 0;
    for (int i = i0; i < i1; i++) {
      if (r[2 * i] < r[2 * i + 1]) {
        lo = min(lo, r[2 * i]);
        hi = max(hi, r[2 * i + 1]);
      }
    }
  }
  __device__ __forceinline__ void block_keys(int q0, int tq, int& lo, int& hi) const {
    span_union(qk, q0, min(q0 + FBQ, tq), lo, hi);
  }
  __device__ __forceinline__ void block_queries(int k0, int tk, int& lo, int& hi) const {
    span_union(kq, k0, min(k0 + BK, tk), lo, hi);
  }
};

// attn_fwd: block (128 threads) = FBQ query rows of head blockIdx.y; warp w
// owns rows 4w..4w+3; within a key tile lane j scores key j, then every lane
// updates its D/32 output columns. A row that sees no key gets out 0 and
// lse −Inf.
template <class R>
__device__ __forceinline__ void attn_fwd(const R& rg, void* out, int dto, float* lse, const void* q, int dtq,
                                         const void* k, int dtk, const void* v, int dtv, int tq, int tk, int hq,
                                         int hkv, int d, float scale) {
  extern __shared__ float sm[];
  float* Ks = sm;                  // BK x (d+1)
  float* Vs = Ks + BK * (d + 1);   // BK x d
  float* Qs = Vs + BK * d;         // FBQ x d
  int h = blockIdx.y, hk = h / (hq / hkv);
  int q0 = blockIdx.x * FBQ;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  load_rows(Qs, d, q, dtq, q0, FBQ, tq, hq, h, d);
  float m[RPW], l[RPW], acc[RPW][DPL];
  int lo[RPW], hi[RPW];
#pragma unroll
  for (int rr = 0; rr < RPW; rr++) {
    int i = q0 + warp * RPW + rr;
    m[rr] = -F_INF;
    l[rr] = 0.0f;
    lo[rr] = hi[rr] = 0;
    if (i < tq) rg.keys(i, tq, lo[rr], hi[rr]);
#pragma unroll
    for (int c = 0; c < DPL; c++) acc[rr][c] = 0.0f;
  }
  int kmin, kend;
  rg.block_keys(q0, tq, kmin, kend);
  for (int j0 = kmin; j0 < kend; j0 += BK) {
    __syncthreads();
    load_rows(Ks, d + 1, k, dtk, j0, BK, tk, hkv, hk, d);
    load_rows(Vs, d, v, dtv, j0, BK, tk, hkv, hk, d);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
      int r = warp * RPW + rr, i = q0 + r;
      if (i >= tq || j0 >= hi[rr] || j0 + BK <= lo[rr]) continue;
      int j = j0 + lane;
      bool valid = j >= lo[rr] && j < hi[rr];
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
      int jn = min(BK, hi[rr] - j0);
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
    if (i >= tq) continue;
    float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
#pragma unroll
    for (int c = 0; c < DPL; c++) {
      int col = lane + 32 * c;
      if (col < d) stf(out, dto, ((i64)i * hq + h) * d + col, acc[rr][c] * inv);
    }
    if (lane == 0) lse[(i64)h * tq + i] = l[rr] > 0.0f ? m[rr] + (float)log((double)l[rr]) : -F_INF;
  }
}

// attn_bwd_dq: same layout as the forward; recomputes p from the saved
// lse and delta = rowsum(dout*out), then dq += ds * K.
template <class R>
__device__ __forceinline__ void attn_bwd_dq(const R& rg, void* dq, int dtdq, const void* dout, int dtdo,
                                            const void* out, int dto, const float* lse, const void* q, int dtq,
                                            const void* k, int dtk, const void* v, int dtv, int tq, int tk, int hq,
                                            int hkv, int d, float scale) {
  extern __shared__ float sm[];
  float* Ks = sm;                  // BK x (d+1)
  float* Vs = Ks + BK * (d + 1);   // BK x (d+1)
  float* Qs = Vs + BK * (d + 1);   // FBQ x d
  float* Gs = Qs + FBQ * d;        // FBQ x d (dout)
  int h = blockIdx.y, hk = h / (hq / hkv);
  int q0 = blockIdx.x * FBQ;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  load_rows(Qs, d, q, dtq, q0, FBQ, tq, hq, h, d);
  load_rows(Gs, d, dout, dtdo, q0, FBQ, tq, hq, h, d);
  __syncthreads();
  float acc[RPW][DPL], L[RPW], delta[RPW];
  int lo[RPW], hi[RPW];
#pragma unroll
  for (int rr = 0; rr < RPW; rr++) {
    int r = warp * RPW + rr, i = q0 + r;
    float dl = 0.0f;
    if (i < tq) {
      for (int c = lane; c < d; c += 32) dl += Gs[r * d + c] * ldf(out, dto, ((i64)i * hq + h) * d + c);
    }
    delta[rr] = warp_sum(dl);
    L[rr] = i < tq ? lse[(i64)h * tq + i] : 0.0f;
    lo[rr] = hi[rr] = 0;
    if (i < tq) rg.keys(i, tq, lo[rr], hi[rr]);
#pragma unroll
    for (int c = 0; c < DPL; c++) acc[rr][c] = 0.0f;
  }
  int kmin, kend;
  rg.block_keys(q0, tq, kmin, kend);
  for (int j0 = kmin; j0 < kend; j0 += BK) {
    __syncthreads();
    load_rows(Ks, d + 1, k, dtk, j0, BK, tk, hkv, hk, d);
    load_rows(Vs, d + 1, v, dtv, j0, BK, tk, hkv, hk, d);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
      int r = warp * RPW + rr, i = q0 + r;
      if (i >= tq || j0 >= hi[rr] || j0 + BK <= lo[rr]) continue;
      int j = j0 + lane;
      bool valid = j >= lo[rr] && j < hi[rr];
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
      int jn = min(BK, hi[rr] - j0);
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
    if (i >= tq) continue;
#pragma unroll
    for (int c = 0; c < DPL; c++) {
      int col = lane + 32 * c;
      if (col < d) stf(dq, dtdq, ((i64)i * hq + h) * d + col, acc[rr][c]);
    }
  }
}

// attn_bwd_dkv: block (128 threads) = BK keys of kv head blockIdx.y; warp w
// owns keys 8w..8w+7. For every query head of the group and every tile of
// KBQ query rows that may see the block's keys, lane i scores query i
// against one key, then every lane adds its D/32 columns of p*dout and
// ds*q into the shared dk/dv accumulators of that key. Sums over the group
// happen here, so K and V are never replicated and no atomics are needed.
template <class R>
__device__ __forceinline__ void attn_bwd_dkv(const R& rg, void* dk, int dtdk, void* dv, int dtdv,
                                             const void* dout, int dtdo, const void* out, int dto, const float* lse,
                                             const void* q, int dtq, const void* k, int dtk, const void* v, int dtv,
                                             int tq, int tk, int hq, int hkv, int d, float scale) {
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
  int* Lo = (int*)(Ds + KBQ);  // KBQ: each row's keys [Lo, Hi)
  int* Hi = Lo + KBQ;          // KBQ
  int hk = blockIdx.y, group = hq / hkv;
  int k0 = blockIdx.x * BK;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  load_rows(Ks, ld, k, dtk, k0, BK, tk, hkv, hk, d);
  load_rows(Vs, ld, v, dtv, k0, BK, tk, hkv, hk, d);
  for (int e = threadIdx.x; e < BK * d; e += blockDim.x) {
    dKs[e] = 0.0f;
    dVs[e] = 0.0f;
  }
  int qbeg, qend;
  rg.block_queries(k0, tk, qbeg, qend);
  for (int h = hk * group; h < (hk + 1) * group; h++) {
    for (int i0 = qbeg; i0 < qend; i0 += KBQ) {
      __syncthreads();
      load_rows(Qs, ld, q, dtq, i0, KBQ, tq, hq, h, d);
      load_rows(Gs, ld, dout, dtdo, i0, KBQ, tq, hq, h, d);
      __syncthreads();
      // delta and lse of the tile's rows: warp w handles rows 8w..8w+7.
      for (int rr = 0; rr < KBQ / 4; rr++) {
        int r = warp * (KBQ / 4) + rr, i = i0 + r;
        float dl = 0.0f;
        if (i < tq)
          for (int c = lane; c < d; c += 32) dl += Gs[r * ld + c] * ldf(out, dto, ((i64)i * hq + h) * d + c);
        dl = warp_sum(dl);
        if (lane == 0) {
          Ds[r] = dl;
          Ls[r] = i < tq ? lse[(i64)h * tq + i] : 0.0f;
          int a = 0, b = 0;
          if (i < tq) rg.keys(i, tq, a, b);
          Lo[r] = a;
          Hi[r] = b;
        }
      }
      __syncthreads();
      int i = i0 + lane;
      for (int kk = 0; kk < KPW; kk++) {
        int kr = warp * KPW + kk, j = k0 + kr;
        if (j >= tk) break;
        bool valid = i < tq && j >= Lo[lane] && j < Hi[lane];
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
    if (j < tk) {
      i64 o = ((i64)j * hkv + hk) * d + c;
      stf(dk, dtdk, o, dKs[e]);
      stf(dv, dtdv, o, dVs[e]);
    }
  }
}

// The causal kernels: q, k and v have t rows, split into sequences by cu.
extern "C" __global__ void __launch_bounds__(128) k_attn_fwd(void* out, int dto, float* lse, const void* q, int dtq,
                                                              const void* k, int dtk, const void* v, int dtv,
                                                              const int* cu, int ns1, int t, int hq, int hkv, int d,
                                                              float scale) {
  attn_fwd(Causal{cu, ns1}, out, dto, lse, q, dtq, k, dtk, v, dtv, t, t, hq, hkv, d, scale);
}
extern "C" __global__ void __launch_bounds__(128) k_attn_bwd_dq(void* dq, int dtdq, const void* dout, int dtdo,
                                                                 const void* out, int dto, const float* lse,
                                                                 const void* q, int dtq, const void* k, int dtk,
                                                                 const void* v, int dtv, const int* cu, int ns1, int t,
                                                                 int hq, int hkv, int d, float scale) {
  attn_bwd_dq(Causal{cu, ns1}, dq, dtdq, dout, dtdo, out, dto, lse, q, dtq, k, dtk, v, dtv, t, t, hq, hkv, d, scale);
}
extern "C" __global__ void __launch_bounds__(128) k_attn_bwd_dkv(void* dk, int dtdk, void* dv, int dtdv,
                                                                  const void* dout, int dtdo, const void* out, int dto,
                                                                  const float* lse, const void* q, int dtq,
                                                                  const void* k, int dtk, const void* v, int dtv,
                                                                  const int* cu, int ns1, int t, int hq, int hkv,
                                                                  int d, float scale) {
  attn_bwd_dkv(Causal{cu, ns1}, dk, dtdk, dv, dtdv, dout, dtdo, out, dto, lse, q, dtq, k, dtk, v, dtv, t, t, hq, hkv, d,
               scale);
}

// The span kernels (ring attention's blocks): q has tq rows, k and v tk;
// qk and kq describe the spans (see Spans).
extern "C" __global__ void __launch_bounds__(128) k_attn_spans_fwd(void* out, int dto, float* lse, const void* q,
                                                                    int dtq, const void* k, int dtk, const void* v,
                                                                    int dtv, const int* qk, const int* kq, int tq,
                                                                    int tk, int hq, int hkv, int d, float scale) {
  attn_fwd(Spans{qk, kq}, out, dto, lse, q, dtq, k, dtk, v, dtv, tq, tk, hq, hkv, d, scale);
}
extern "C" __global__ void __launch_bounds__(128) k_attn_spans_bwd_dq(void* dq, int dtdq, const void* dout, int dtdo,
                                                                       const void* out, int dto, const float* lse,
                                                                       const void* q, int dtq, const void* k, int dtk,
                                                                       const void* v, int dtv, const int* qk,
                                                                       const int* kq, int tq, int tk, int hq, int hkv,
                                                                       int d, float scale) {
  attn_bwd_dq(Spans{qk, kq}, dq, dtdq, dout, dtdo, out, dto, lse, q, dtq, k, dtk, v, dtv, tq, tk, hq, hkv, d, scale);
}
extern "C" __global__ void __launch_bounds__(128) k_attn_spans_bwd_dkv(void* dk, int dtdk, void* dv, int dtdv,
                                                                        const void* dout, int dtdo, const void* out,
                                                                        int dto, const float* lse, const void* q,
                                                                        int dtq, const void* k, int dtk, const void* v,
                                                                        int dtv, const int* qk, const int* kq, int tq,
                                                                        int tk, int hq, int hkv, int d, float scale) {
  attn_bwd_dkv(Spans{qk, kq}, dk, dtdk, dv, dtdv, dout, dtdo, out, dto, lse, q, dtq, k, dtk, v, dtv, tq, tk, hq, hkv, d,
               scale);
}

// k_attn_merge merges a block's attention (bout, blse) into (out, lse),
// [T,H,D] and [H,T]: the log-sum-exp rule, a row's weights exp(lse − new)
// and exp(blse − new) with new = log(e^lse + e^blse). A block row with lse
// −Inf (it saw no key) leaves the row as it was. One thread per (row, head).
extern "C" __global__ void k_attn_merge(void* out, int dto, float* lse, const void* bout, int dtb, const float* blse,
                                        int t, int hn, int d) {
  i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= (i64)t * hn) return;
  int i = (int)(e / hn), h = (int)(e - (i64)i * hn);
  float l1 = lse[(i64)h * t + i], l2 = blse[(i64)h * t + i];
  if (l2 == -F_INF) return;
  float mx = fmaxf(l1, l2);
  float w1 = expf(l1 - mx), w2 = expf(l2 - mx);
  float sum = w1 + w2;
  lse[(i64)h * t + i] = mx + logf(sum);
  w1 /= sum;
  w2 /= sum;
  i64 o = ((i64)i * hn + h) * d;
  for (int c = 0; c < d; c++) stf(out, dto, o + c, w1 * ldf(out, dto, o + c) + w2 * ldf(bout, dtb, o + c));
}

// ---------------------------------------------------------------------------
// Tensor-core attention (FlashAttention-2 style) for bf16 and f16 operands
// with head dims 64 and 128. Every tensor is [T,H,D] of one 16-bit dtype;
// the host checks dtypes, head dim and 16-byte alignment, and uses the SIMT
// kernels above for anything else (f32 included, which stays exact).
//
// Layout: a CTA is 4 warps (128 threads). Tiles hold 64 rows of D elements
// in shared memory with a row stride of D+8 elements, so that the 8 rows an
// ldmatrix reads start 16 bytes apart and hit different banks. Global tiles
// arrive through cp.async (16 bytes a thread, zero-filled past T), each
// load issued while the CTA computes on other tiles. Products use mma.sync m16n8k16 with fp32 accumulators;
// softmax statistics stay in fp32 registers. Scores are handled in the
// log2 domain: x = (q·k)·scale·log2(e), p = 2^(x − m).
//
// Fragment conventions of m16n8k16 (g = lane/4, c = lane%4): A (16x16)
// regs a0 (row g, k 2c..2c+1), a1 (row g+8), a2 (row g, k 2c+8..), a3
// (row g+8, k 2c+8..); B (16x8) b0 (k 2c..2c+1, col g), b1 (k 2c+8..,
// col g); C (16x8) c0,c1 (row g, cols 2c..2c+1), c2,c3 (row g+8).
// ---------------------------------------------------------------------------

#define FA_BM 64           // query rows per forward / dq CTA, keys per dk/dv CTA
#define FA_BK 64           // keys per tile in the forward and dq kernels
#define FA_LOG2E LOG2E
#define FA_LN2 0.6931471805599453f


// fa_cp16 copies 16 bytes from global to shared memory asynchronously; with
// ok false it writes zeros and reads nothing.
__device__ __forceinline__ void fa_cp16(u32 dst, const void* src, bool ok) {
  int n = ok ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
// fa_cp4 and fa_cp8 are fa_cp16 for 4 and 8 bytes (through L1: cp.async
// takes .cg for 16 bytes only).
__device__ __forceinline__ void fa_cp4(u32 dst, const void* src, bool ok) {
  int n = ok ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void fa_cp8(u32 dst, const void* src, bool ok) {
  int n = ok ? 8 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void fa_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void fa_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void fa_ldsm4(u32 addr, u32* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void fa_ldsm4t(u32 addr, u32* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// fa_mma accumulates d += a*b for one m16n8k16 tile.
template <bool F16>
__device__ __forceinline__ void fa_mma(float* d, const u32* a, u32 b0, u32 b1) {
  if (F16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// fa_pack rounds lo and hi to the 16-bit dtype (nearest even) and packs
// them, lo in the low half.
template <bool F16>
__device__ __forceinline__ u32 fa_pack(float lo, float hi) {
  u32 r;
  if (F16) asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <bool F16>
__device__ __forceinline__ float fa_tof(u16 h) {
  return F16 ? h2f(h) : bf2f(h);
}


// fa_lane_addr is the ldmatrix row address of this lane for the four 8x8
// matrices at (row0 + rsel*8, col0 + csel*8), where matrix m = lane/8 has
// rsel = m&1, csel = m>>1 (A operands and trans B operands) or rsel = m>>1,
// csel = m&1 (B operands stored as [n][k]).
__device__ __forceinline__ u32 fa_addr_a(u32 base, int ld, int row0, int col0) {
  int l = threadIdx.x & 31, m = l >> 3;
  return base + 2u * (u32)((row0 + (m & 1) * 8 + (l & 7)) * ld + col0 + (m >> 1) * 8);
}
__device__ __forceinline__ u32 fa_addr_b(u32 base, int ld, int row0, int col0) {
  int l = threadIdx.x & 31, m = l >> 3;
  return base + 2u * (u32)((row0 + (m >> 1) * 8 + (l & 7)) * ld + col0 + (m & 1) * 8);
}

// fa_load_rows issues cp.async for rows [r0, r0+n) of head h of a [T,H,D]
// tensor into a shared tile of stride LD, zero-filling rows outside [0,t).
template <int D, int N>
__device__ __forceinline__ void fa_load_rows(u16* dst, const u16* src, int r0, int t, int heads, int h) {
  constexpr int LD = D + 8, CH = D / 8;
  u32 base = fa_smem(dst);
#pragma unroll
  for (int e = threadIdx.x; e < N * CH; e += 128) {
    int r = e / CH, c = e - r * CH, i = r0 + r;
    bool ok = i >= 0 && i < t;
    const u16* p = ok ? src + ((i64)i * heads + h) * D + c * 8 : src;
    fa_cp16(base + 2u * (u32)(r * LD + c * 8), p, ok);
  }
}

// fa_store_rows writes the 16 staged rows of a warp (shared tile rows
// [w*16, w*16+16)) to rows [r0, r0+16) of head h of a [T,H,D] tensor,
// skipping rows at or past t, 16 bytes a lane.
template <int D>
__device__ __forceinline__ void fa_store_rows(u16* dst, const u16* tile, int w, int r0, int t, int heads, int h) {
  constexpr int LD = D + 8, CH = D / 8;
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int e = lane; e < 16 * CH; e += 32) {
    int r = e / CH, c = e - r * CH, i = r0 + r;
    if (i < t) *(uint4*)(dst + ((i64)i * heads + h) * D + c * 8) = *(const uint4*)(tile + (w * 16 + r) * LD + c * 8);
  }
}

// fa_stage writes a warp's 16xD fp32 accumulator fragments, times mul, into
// its 16 rows of a shared tile as the 16-bit dtype.
template <int D, bool F16>
__device__ __forceinline__ void fa_stage(u16* tile, int w, float (*acc)[4], float mul_a, float mul_b) {
  constexpr int LD = D + 8;
  int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int dt = 0; dt < D / 8; dt++) {
    *(u32*)(tile + (w * 16 + g) * LD + dt * 8 + 2 * c) = fa_pack<F16>(acc[dt][0] * mul_a, acc[dt][1] * mul_a);
    *(u32*)(tile + (w * 16 + g + 8) * LD + dt * 8 + 2 * c) = fa_pack<F16>(acc[dt][2] * mul_b, acc[dt][3] * mul_b);
  }
}


// fa_delta reads delta (rowsum(dout*out), fp32) for row i of head h from the
// first 4 bytes of dq's row, where k_fa_bwd_pre left it.
template <int D>
__device__ __forceinline__ float fa_delta(const u16* dq, int i, int hq, int h) {
  return *(const float*)(dq + ((i64)i * hq + h) * D);
}

// fa_frag packs the 16-bit A fragment of k-step kk (columns 16kk..16kk+15)
// from fp32 accumulator fragments s[NT][4] (C layout of m16n8k16, which is
// also the per-warp layout of a wgmma accumulator).
template <bool F16>
__device__ __forceinline__ void fa_frag(float (*s)[4], int kk, u32* a) {
  a[0] = fa_pack<F16>(s[2 * kk][0], s[2 * kk][1]);
  a[1] = fa_pack<F16>(s[2 * kk][2], s[2 * kk][3]);
  a[2] = fa_pack<F16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = fa_pack<F16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// fa_softmax turns a tile of scores s[NT][4] (keys j0.., rows ia and ib =
// ia+8 of this lane, which see keys [sta, ia] and [stb, ib]) into
// probabilities 2^(s·sl2 − m), masking when need is set, and updates the
// running maxima ma, mb (of s·sl2) and sums la, lb (per lane; summed over
// the quad at the end). It returns in ca, cb the factors the output rows
// must be scaled by. The exponent is one fma, rounded once, as in the
// backward (fa_ds_rows with FMA); the maxima are taken over s and then
// scaled, which gives those of s·sl2 (sl2 > 0, rounding is monotonic).
template <int NT>
__device__ __forceinline__ void fa_softmax(float (*s)[4], bool need, int j0, int c, int sta, int ia, int stb, int ib,
                                           float sl2, float& ma, float& mb, float& la, float& lb, float& ca,
                                           float& cb) {
  float mxa = -F_INF, mxb = -F_INF;
#pragma unroll
  for (int nt = 0; nt < NT; nt++) {
    if (need) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int j = j0 + nt * 8 + 2 * c + (e & 1);
        bool ok = e < 2 ? (j >= sta && j <= ia) : (j >= stb && j <= ib);
        if (!ok) s[nt][e] = -F_INF;
      }
    }
    mxa = fmaxf(mxa, fmaxf(s[nt][0], s[nt][1]));
    mxb = fmaxf(mxb, fmaxf(s[nt][2], s[nt][3]));
  }
  mxa = quad_max(mxa) * sl2;
  mxb = quad_max(mxb) * sl2;
  float mna = fmaxf(ma, mxa), mnb = fmaxf(mb, mxb);
  float ba = mna == -F_INF ? 0.0f : mna, bb = mnb == -F_INF ? 0.0f : mnb;
  ca = exp2_approx(ma - ba);
  cb = exp2_approx(mb - bb);
  ma = mna;
  mb = mnb;
  float ra = 0.0f, rb = 0.0f;
#pragma unroll
  for (int nt = 0; nt < NT; nt++) {
    s[nt][0] = exp2_approx(fmaf(s[nt][0], sl2, -ba));
    s[nt][1] = exp2_approx(fmaf(s[nt][1], sl2, -ba));
    s[nt][2] = exp2_approx(fmaf(s[nt][2], sl2, -bb));
    s[nt][3] = exp2_approx(fmaf(s[nt][3], sl2, -bb));
    ra += s[nt][0] + s[nt][1];
    rb += s[nt][2] + s[nt][3];
  }
  la = la * ca + ra;
  lb = lb * cb + rb;
}

// fa_rescale multiplies a lane's output fragments o[ND][4] by ca (row ia)
// and cb (row ib), fa_softmax's factors.
template <int ND>
__device__ __forceinline__ void fa_rescale(float (*o)[4], float ca, float cb) {
#pragma unroll
  for (int dt = 0; dt < ND; dt++) {
    o[dt][0] *= ca;
    o[dt][1] *= ca;
    o[dt][2] *= cb;
    o[dt][3] *= cb;
  }
}

// FaRows is what a lane of a warp owning query rows wi0..wi0+15 needs to
// mask its scores (fa_softmax): its rows ia and ib = ia+8, the keys they
// see, [sta, ea] and [stb, eb], and for causal rows wst1, the sequence
// start of the warp's last row below t (t when it has none).
struct FaRows {
  int wi0, ia, ib, sta, ea, stb, eb, wst1;
};
// fa_rows returns the FaRows of causal rows: a row sees its sequence's
// keys up to itself (none at or past t).
__device__ __forceinline__ FaRows fa_rows(const int* cu, int ns1, int t, int wi0, int g) {
  FaRows r;
  int wi1 = min(wi0 + 15, t - 1);
  r.wi0 = wi0;
  r.ia = r.ea = wi0 + g;
  r.ib = r.eb = r.ia + 8;
  r.sta = r.ia < t ? seq_start(cu, ns1, r.ia) : t;
  r.stb = r.ib < t ? seq_start(cu, ns1, r.ib) : t;
  r.wst1 = wi1 >= wi0 ? seq_start(cu, ns1, wi1) : t;
  return r;
}
// fa_span_rows returns the FaRows of span attention's rows: row i of tq
// sees keys [qk[2i], qk[2i+1]), none when that is empty or i >= tq.
__device__ __forceinline__ FaRows fa_span_rows(const int* qk, int tq, int wi0, int g) {
  FaRows r;
  r.wi0 = wi0;
  r.ia = wi0 + g;
  r.ib = r.ia + 8;
  r.sta = r.stb = 0;
  r.ea = r.eb = -1;
  r.wst1 = 0;
  if (r.ia < tq) {
    r.sta = qk[2 * r.ia];
    r.ea = qk[2 * r.ia + 1] - 1;
  }
  if (r.ib < tq) {
    r.stb = qk[2 * r.ib];
    r.eb = qk[2 * r.ib + 1] - 1;
  }
  return r;
}

// fa_ds_rows_m is fa_ds_rows (below) with its mask decided at compile
// time (MASK): with it decided inside the loop, a tile that needs no mask
// ran a branch a score.
template <int NT, bool FMA, bool MASK>
__device__ __forceinline__ void fa_ds_rows_m(float (*s)[4], float (*dp)[4], int j0, int c, int sta, int ia,
                                             int stb, int ib, float sl2, float La, float Lb, float Da, float Db) {
#pragma unroll
  for (int nt = 0; nt < NT; nt++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      bool ok = true;
      if (MASK) {
        int j = j0 + nt * 8 + 2 * c + (e & 1);
        ok = e < 2 ? (j >= sta && j <= ia) : (j >= stb && j <= ib);
      }
      float L = e < 2 ? La : Lb, Dl = e < 2 ? Da : Db;
      float p = ok ? exp2_approx(FMA ? __fmaf_rn(s[nt][e], sl2, -L) : s[nt][e] * sl2 - L) : 0.0f;
      s[nt][e] = p * (dp[nt][e] - Dl);
    }
  }
}

// fa_ds_rows turns scores s and dP = dout·Vᵀ (rows ia, ib of this lane are
// queries with lse·log2(e) La, Lb and delta Da, Db; columns are keys j0..)
// into dS = P∘(dP − delta) in s, masking when need is set.
// With FMA each probability is 2^fma(s, sl2, −L), rounded once instead of
// twice.
template <int NT, bool FMA = false>
__device__ __forceinline__ void fa_ds_rows(float (*s)[4], float (*dp)[4], bool need, int j0, int c, int sta, int ia,
                                           int stb, int ib, float sl2, float La, float Lb, float Da, float Db) {
  if (need) {
    fa_ds_rows_m<NT, FMA, true>(s, dp, j0, c, sta, ia, stb, ib, sl2, La, Lb, Da, Db);
  } else {
    fa_ds_rows_m<NT, FMA, false>(s, dp, j0, c, sta, ia, stb, ib, sl2, La, Lb, Da, Db);
  }
}

// fa_ds_cols_m is fa_ds_cols (below) with its mask decided at compile
// time (MASK): with it decided inside the loop, a tile that needs no mask
// ran a branch a score.
template <int NT, bool MASK>
__device__ __forceinline__ void fa_ds_cols_m(float (*s)[4], float (*dp)[4], int i0, int c, int ja, int jb,
                                             const float* L, const float* Dl, const int* St, float sl2) {
#pragma unroll
  for (int nt = 0; nt < NT; nt++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int ci = nt * 8 + 2 * c + (e & 1);
      bool ok = true;
      if (MASK) {
        int i = i0 + ci, j = e < 2 ? ja : jb;
        ok = j <= i && j >= St[ci];
      }
      float p = ok ? exp2_approx(s[nt][e] * sl2 - L[ci]) : 0.0f;
      s[nt][e] = p;
      dp[nt][e] = p * (dp[nt][e] - Dl[ci]);
    }
  }
}

// fa_ds_cols is fa_ds_rows transposed (the dk/dv kernels): rows ja, jb of
// this lane are keys, columns queries i0.. with lse·log2(e) L[], delta Dl[]
// and sequence starts St[] (per column). It leaves Pᵀ in s and dSᵀ in dp.
template <int NT>
__device__ __forceinline__ void fa_ds_cols(float (*s)[4], float (*dp)[4], bool need, int i0, int c, int ja, int jb,
                                           const float* L, const float* Dl, const int* St, float sl2) {
  if (need) {
    fa_ds_cols_m<NT, true>(s, dp, i0, c, ja, jb, L, Dl, St, sl2);
  } else {
    fa_ds_cols_m<NT, false>(s, dp, i0, c, ja, jb, L, Dl, St, sl2);
  }
}

// fa_fwd: CTA = 64 query rows [q0, q0+64) of head blockIdx.y; warp w owns
// rows 16w..16w+15 and keeps its Q fragments in registers. Key tiles run
// from the start of the first row's sequence to the last row; scores of
// keys outside a row's sequence prefix [start, i] are masked, so tiles may
// straddle sequence boundaries. K and V have one buffer each (Q, K, V: 3
// tiles, so 3 CTAs fit an SM): the load of V overlaps QKᵀ and the softmax,
// the load of the next K overlaps PV.
template <int D, bool F16>
__device__ __forceinline__ void fa_fwd(u16* out, float* lse, const u16* q, const u16* k, const u16* v, const int* cu,
                                       int ns1, int t, int hq, int hkv, float scale) {
  constexpr int LD = D + 8, KD = D / 16, ND = D / 8, TILE = FA_BM * LD;
  extern __shared__ __align__(16) u16 fa_sm[];
  u16* Qs = fa_sm;
  u16* Ks = Qs + TILE;
  u16* Vs = Ks + TILE;
  int h = blockIdx.y, hk = h / (hq / hkv);
  int q0 = (gridDim.x - 1 - blockIdx.x) * FA_BM;  // heavy (late) tiles start first
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  int qlast = min(q0 + FA_BM - 1, t - 1);
  int kmin = seq_start(cu, ns1, q0);
  int ntiles = (qlast - kmin) / FA_BK + 1;
  fa_load_rows<D, FA_BM>(Qs, q, q0, t, hq, h);
  fa_load_rows<D, FA_BK>(Ks, k, kmin, t, hkv, hk);
  fa_commit();
  fa_load_rows<D, FA_BK>(Vs, v, kmin, t, hkv, hk);
  fa_commit();

  int wi0 = q0 + warp * 16;               // first row of the warp
  int wi1 = min(wi0 + 15, t - 1);         // last valid row of the warp
  int ia = wi0 + g, ib = ia + 8;
  int sta = ia < t ? seq_start(cu, ns1, ia) : t;
  int stb = ib < t ? seq_start(cu, ns1, ib) : t;
  int wst0 = wi0 < t ? seq_start(cu, ns1, wi0) : t;
  int wst1 = wi1 >= wi0 ? seq_start(cu, ns1, wi1) : t;
  float sl2 = scale * FA_LOG2E;

  u32 qf[KD][4];
  float o[ND][4];
#pragma unroll
  for (int dt = 0; dt < ND; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float ma = -F_INF, mb = -F_INF, la = 0.0f, lb = 0.0f;

  for (int n = 0; n < ntiles; n++) {
    int j0 = kmin + n * FA_BK;
    // Pending groups here: K(n) (with Q at n = 0), then V(n).
    fa_wait<1>();
    __syncthreads();
    if (n == 0) {
      u32 qb = fa_smem(Qs);
#pragma unroll
      for (int kk = 0; kk < KD; kk++) fa_ldsm4(fa_addr_a(qb, LD, warp * 16, kk * 16), qf[kk]);
    }
    bool skip = wi0 >= t || j0 > wi1 || j0 + FA_BK - 1 < wst0;
    u32 kb = fa_smem(Ks), vb = fa_smem(Vs);
    float s[FA_BK / 8][4];
    if (!skip) {
#pragma unroll
      for (int nt = 0; nt < FA_BK / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < KD; kk++) {
#pragma unroll
        for (int np = 0; np < FA_BK / 16; np++) {
          u32 b[4];
          fa_ldsm4(fa_addr_b(kb, LD, np * 16, kk * 16), b);
          fa_mma<F16>(s[2 * np], qf[kk], b[0], b[1]);
          fa_mma<F16>(s[2 * np + 1], qf[kk], b[2], b[3]);
        }
      }
      bool need = j0 + FA_BK - 1 > wi0 || j0 < wst1 || wi0 + 15 >= t;
      float ca, cb;
      fa_softmax<FA_BK / 8>(s, need, j0, c, sta, ia, stb, ib, sl2, ma, mb, la, lb, ca, cb);
      fa_rescale<ND>(o, ca, cb);
    }
    // V(n) has landed and every warp is done with K(n): load K(n+1).
    fa_wait<0>();
    __syncthreads();
    if (n + 1 < ntiles) {
      fa_load_rows<D, FA_BK>(Ks, k, j0 + FA_BK, t, hkv, hk);
      fa_commit();
    }
    if (!skip) {
#pragma unroll
      for (int kk = 0; kk < FA_BK / 16; kk++) {
        u32 a[4];
        fa_frag<F16>(s, kk, a);
#pragma unroll
        for (int dp = 0; dp < ND / 2; dp++) {
          u32 b[4];
          fa_ldsm4t(fa_addr_a(vb, LD, kk * 16, dp * 16), b);
          fa_mma<F16>(o[2 * dp], a, b[0], b[1]);
          fa_mma<F16>(o[2 * dp + 1], a, b[2], b[3]);
        }
      }
    }
    // Every warp is done with V(n): load V(n+1).
    __syncthreads();
    if (n + 1 < ntiles) {
      fa_load_rows<D, FA_BK>(Vs, v, j0 + FA_BK, t, hkv, hk);
      fa_commit();
    }
  }
  la = quad_sum(la);
  lb = quad_sum(lb);
  // Each warp stages its rows into its own rows of Qs (only it read them).
  fa_stage<D, F16>(Qs, warp, o, la > 0.0f ? 1.0f / la : 0.0f, lb > 0.0f ? 1.0f / lb : 0.0f);
  __syncwarp();
  fa_store_rows<D>(out, Qs, warp, wi0, t, hq, h);
  if (c == 0) {
    if (ia < t) lse[(i64)h * t + ia] = (ma + log2f(la)) * FA_LN2;
    if (ib < t) lse[(i64)h * t + ib] = (mb + log2f(lb)) * FA_LN2;
  }
}

// fa_bwd_pre stores delta = rowsum(dout*out) (fp32, from the 16-bit values)
// in the first 4 bytes of each [i,h] row of dq and the start of token i's
// sequence (int32) in the next 4, which the dk/dv kernels read and the dq
// kernel overwrites last: the backward needs no workspace. D/8 lanes share
// a row, 8 elements each; rows are t·hq, token-major. Without START (span
// attention, k_wg_spans_pre_*) it stores delta alone.
template <int D, bool F16, bool START = true>
__device__ __forceinline__ void fa_bwd_pre(u16* dq, const u16* dout, const u16* out, int rows, const int* cu, int ns1,
                                           int hq) {
  constexpr int CH = D / 8;
  i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 r = e / CH;
  int cc = (int)(e % CH);
  float s = 0.0f;
  if (r < rows) {
    uint4 a = *(const uint4*)(dout + r * D + cc * 8);
    uint4 b = *(const uint4*)(out + r * D + cc * 8);
    const u16* pa = (const u16*)&a;
    const u16* pb = (const u16*)&b;
#pragma unroll
    for (int x = 0; x < 8; x++) s = __fmaf_rn(fa_tof<F16>(pa[x]), fa_tof<F16>(pb[x]), s);
  }
#pragma unroll
  for (int o = 1; o < CH; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (r < rows && cc == 0) {
    *(float*)(dq + r * D) = s;
    if (START) *(int*)(dq + r * D + 2) = seq_start(cu, ns1, (int)(r / hq));
  }
}

// fa_bwd_dq: CTA = 64 query rows of head blockIdx.y (like the forward); Q
// and dout stay in shared memory, K/V tiles stream. P is recomputed from the
// saved lse, dS = P∘(dP − delta), dq = scale·dS·K. Deterministic. K and V
// have one buffer each (4 tiles, so 3 CTAs fit an SM): the load of the
// next V overlaps dS·K.
template <int D, bool F16>
__device__ __forceinline__ void fa_bwd_dq(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k,
                                          const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale) {
  constexpr int LD = D + 8, KD = D / 16, ND = D / 8, TILE = FA_BM * LD;
  extern __shared__ __align__(16) u16 fa_sm[];
  u16* Qs = fa_sm;
  u16* Gs = Qs + TILE;
  u16* Ks = Gs + TILE;
  u16* Vs = Ks + TILE;
  int h = blockIdx.y, hk = h / (hq / hkv);
  int q0 = (gridDim.x - 1 - blockIdx.x) * FA_BM;  // heavy (late) tiles start first
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  int qlast = min(q0 + FA_BM - 1, t - 1);
  int kmin = seq_start(cu, ns1, q0);
  int ntiles = (qlast - kmin) / FA_BK + 1;
  fa_load_rows<D, FA_BM>(Qs, q, q0, t, hq, h);
  fa_load_rows<D, FA_BM>(Gs, dout, q0, t, hq, h);
  fa_load_rows<D, FA_BK>(Ks, k, kmin, t, hkv, hk);
  fa_load_rows<D, FA_BK>(Vs, v, kmin, t, hkv, hk);
  fa_commit();

  int wi0 = q0 + warp * 16;
  int wi1 = min(wi0 + 15, t - 1);
  int ia = wi0 + g, ib = ia + 8;
  int sta = ia < t ? seq_start(cu, ns1, ia) : t;
  int stb = ib < t ? seq_start(cu, ns1, ib) : t;
  int wst0 = wi0 < t ? seq_start(cu, ns1, wi0) : t;
  int wst1 = wi1 >= wi0 ? seq_start(cu, ns1, wi1) : t;
  float sl2 = scale * FA_LOG2E;
  float La = ia < t ? lse[(i64)h * t + ia] * FA_LOG2E : 0.0f;
  float Lb = ib < t ? lse[(i64)h * t + ib] * FA_LOG2E : 0.0f;
  float Da = ia < t ? fa_delta<D>(dq, ia, hq, h) : 0.0f;
  float Db = ib < t ? fa_delta<D>(dq, ib, hq, h) : 0.0f;

  float acc[ND][4];
#pragma unroll
  for (int dt = 0; dt < ND; dt++) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.0f;
  u32 qb = fa_smem(Qs), gb = fa_smem(Gs);

  for (int n = 0; n < ntiles; n++) {
    int j0 = kmin + n * FA_BK;
    fa_wait<0>();  // K(n) and V(n)
    __syncthreads();
    bool skip = wi0 >= t || j0 > wi1 || j0 + FA_BK - 1 < wst0;
    u32 kb = fa_smem(Ks), vb = fa_smem(Vs);
    float s[FA_BK / 8][4];
    if (!skip) {
      float dp[FA_BK / 8][4];
#pragma unroll
      for (int nt = 0; nt < FA_BK / 8; nt++) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        dp[nt][0] = dp[nt][1] = dp[nt][2] = dp[nt][3] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < KD; kk++) {
        u32 a[4], ag[4];
        fa_ldsm4(fa_addr_a(qb, LD, warp * 16, kk * 16), a);
        fa_ldsm4(fa_addr_a(gb, LD, warp * 16, kk * 16), ag);
#pragma unroll
        for (int np = 0; np < FA_BK / 16; np++) {
          u32 b[4];
          fa_ldsm4(fa_addr_b(kb, LD, np * 16, kk * 16), b);
          fa_mma<F16>(s[2 * np], a, b[0], b[1]);
          fa_mma<F16>(s[2 * np + 1], a, b[2], b[3]);
          fa_ldsm4(fa_addr_b(vb, LD, np * 16, kk * 16), b);
          fa_mma<F16>(dp[2 * np], ag, b[0], b[1]);
          fa_mma<F16>(dp[2 * np + 1], ag, b[2], b[3]);
        }
      }
      bool need = j0 + FA_BK - 1 > wi0 || j0 < wst1 || wi0 + 15 >= t;
      fa_ds_rows<FA_BK / 8>(s, dp, need, j0, c, sta, ia, stb, ib, sl2, La, Lb, Da, Db);
    }
    // Every warp is done with V(n): load V(n+1).
    __syncthreads();
    if (n + 1 < ntiles) {
      fa_load_rows<D, FA_BK>(Vs, v, j0 + FA_BK, t, hkv, hk);
      fa_commit();
    }
    if (!skip) {
#pragma unroll
      for (int kk = 0; kk < FA_BK / 16; kk++) {
        u32 a[4];
        fa_frag<F16>(s, kk, a);
#pragma unroll
        for (int dq2 = 0; dq2 < ND / 2; dq2++) {
          u32 b[4];
          fa_ldsm4t(fa_addr_a(kb, LD, kk * 16, dq2 * 16), b);
          fa_mma<F16>(acc[2 * dq2], a, b[0], b[1]);
          fa_mma<F16>(acc[2 * dq2 + 1], a, b[2], b[3]);
        }
      }
    }
    // Every warp is done with K(n): load K(n+1).
    __syncthreads();
    if (n + 1 < ntiles) {
      fa_load_rows<D, FA_BK>(Ks, k, j0 + FA_BK, t, hkv, hk);
      fa_commit();
    }
  }
  // Each warp stages its rows into its own rows of Qs (only it read them).
  fa_stage<D, F16>(Qs, warp, acc, scale, scale);
  __syncwarp();
  fa_store_rows<D>(dq, Qs, warp, wi0, t, hq, h);
}

// fa_bwd_dkv: CTA = 64 keys [k0, k0+64) of kv head blockIdx.y; warp w owns
// keys 16w..16w+15 and accumulates their dK and dV rows in registers over
// every query head of the group and every tile of BN query rows that can
// see the keys (from k0 to the end of the last key's sequence), so the
// group sum needs no atomics. Per tile: Sᵀ = K·Qᵀ, dPᵀ = V·doutᵀ, Pᵀ from
// the saved lse, dV += Pᵀ·dout, dSᵀ = Pᵀ∘(dPᵀ − delta), dK += dSᵀ·Q.
template <int D, int BN, bool F16>
__device__ __forceinline__ void fa_bwd_dkv(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse,
                                           const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t,
                                           int hq, int hkv, float scale) {
  constexpr int LD = D + 8, KD = D / 16, ND = D / 8, TILE = FA_BM * LD, QT = BN * LD;
  extern __shared__ __align__(16) u16 fa_sm[];
  u16* Ks = fa_sm;
  u16* Vs = Ks + TILE;
  u16* Qs = Vs + TILE;      // 2 buffers of BN rows
  u16* Gs = Qs + 2 * QT;    // 2 buffers of BN rows
  float* Ls = (float*)(Gs + 2 * QT);  // 2 x BN: lse·log2(e)
  float* Ds = Ls + 2 * BN;            // 2 x BN: delta
  int* Ss = (int*)(Ds + 2 * BN);      // 2 x BN: sequence start (t past the end)
  int hk = blockIdx.y, group = hq / hkv;
  int k0 = blockIdx.x * FA_BM;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  int klast = min(k0 + FA_BM - 1, t - 1);
  int qend = seq_end(cu, ns1, klast, t);
  int nqt = (qend - k0 + BN - 1) / BN;
  int total = group * nqt;

  fa_load_rows<D, FA_BM>(Ks, k, k0, t, hkv, hk);
  fa_load_rows<D, FA_BM>(Vs, v, k0, t, hkv, hk);
  // stage issues the loads of step n (query head, query tile) into buffer b.
  auto stage = [&](int n, int b) {
    int h = hk * group + n / nqt, i0 = k0 + (n % nqt) * BN;
    fa_load_rows<D, BN>(Qs + b * QT, q, i0, t, hq, h);
    fa_load_rows<D, BN>(Gs + b * QT, dout, i0, t, hq, h);
    if (threadIdx.x < BN) {
      int i = i0 + threadIdx.x;
      bool ok = i < t;
      Ls[b * BN + threadIdx.x] = ok ? lse[(i64)h * t + i] * FA_LOG2E : 0.0f;
      Ds[b * BN + threadIdx.x] = ok ? fa_delta<D>(dq, i, hq, h) : 0.0f;
      Ss[b * BN + threadIdx.x] = ok ? seq_start(cu, ns1, i) : t;
    }
  };
  stage(0, 0);
  fa_commit();

  int kw0 = k0 + warp * 16;
  int ja = kw0 + g, jb = ja + 8;
  float sl2 = scale * FA_LOG2E;
  float dka[ND][4], dva[ND][4];
#pragma unroll
  for (int dt = 0; dt < ND; dt++) {
    dka[dt][0] = dka[dt][1] = dka[dt][2] = dka[dt][3] = 0.0f;
    dva[dt][0] = dva[dt][1] = dva[dt][2] = dva[dt][3] = 0.0f;
  }
  u32 kb = fa_smem(Ks), vb = fa_smem(Vs);

  for (int n = 0; n < total; n++) {
    int b = n & 1;
    int i0 = k0 + (n % nqt) * BN;
    if (n + 1 < total) {
      stage(n + 1, b ^ 1);
      fa_commit();
      fa_wait<1>();
    } else {
      fa_wait<0>();
    }
    __syncthreads();
    const float* L = Ls + b * BN;
    const float* Dl = Ds + b * BN;
    const int* St = Ss + b * BN;
    bool skip = kw0 >= t || i0 + BN - 1 < kw0 || St[0] > kw0 + 15;
    if (!skip) {
      u32 qb = fa_smem(Qs + b * QT), gb = fa_smem(Gs + b * QT);
      float s[BN / 8][4], dp[BN / 8][4];
#pragma unroll
      for (int nt = 0; nt < BN / 8; nt++) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        dp[nt][0] = dp[nt][1] = dp[nt][2] = dp[nt][3] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < KD; kk++) {
        u32 a[4], av[4];
        fa_ldsm4(fa_addr_a(kb, LD, warp * 16, kk * 16), a);
        fa_ldsm4(fa_addr_a(vb, LD, warp * 16, kk * 16), av);
#pragma unroll
        for (int np = 0; np < BN / 16; np++) {
          u32 bb[4];
          fa_ldsm4(fa_addr_b(qb, LD, np * 16, kk * 16), bb);
          fa_mma<F16>(s[2 * np], a, bb[0], bb[1]);
          fa_mma<F16>(s[2 * np + 1], a, bb[2], bb[3]);
          fa_ldsm4(fa_addr_b(gb, LD, np * 16, kk * 16), bb);
          fa_mma<F16>(dp[2 * np], av, bb[0], bb[1]);
          fa_mma<F16>(dp[2 * np + 1], av, bb[2], bb[3]);
        }
      }
      bool need = i0 < kw0 + 15 || St[BN - 1] > kw0 || i0 + BN > t;
      fa_ds_cols<BN / 8>(s, dp, need, i0, c, ja, jb, L, Dl, St, sl2);
#pragma unroll
      for (int kk = 0; kk < BN / 16; kk++) {
        u32 ap[4], ad[4];
        fa_frag<F16>(s, kk, ap);
        fa_frag<F16>(dp, kk, ad);
#pragma unroll
        for (int d2 = 0; d2 < ND / 2; d2++) {
          u32 bb[4];
          fa_ldsm4t(fa_addr_a(gb, LD, kk * 16, d2 * 16), bb);
          fa_mma<F16>(dva[2 * d2], ap, bb[0], bb[1]);
          fa_mma<F16>(dva[2 * d2 + 1], ap, bb[2], bb[3]);
          fa_ldsm4t(fa_addr_a(qb, LD, kk * 16, d2 * 16), bb);
          fa_mma<F16>(dka[2 * d2], ad, bb[0], bb[1]);
          fa_mma<F16>(dka[2 * d2 + 1], ad, bb[2], bb[3]);
        }
      }
    }
    __syncthreads();
  }
  // Each warp stages its rows into its own rows of Ks and Vs (only it read
  // them).
  fa_stage<D, F16>(Ks, warp, dka, scale, scale);
  fa_stage<D, F16>(Vs, warp, dva, 1.0f, 1.0f);
  __syncwarp();
  fa_store_rows<D>(dk, Ks, warp, kw0, t, hkv, hk);
  fa_store_rows<D>(dv, Vs, warp, kw0, t, hkv, hk);
}

// ---------------------------------------------------------------------------
// Hopper tensor-core attention (sm_90a): the three kernels above, ported to
// wgmma. A warpgroup (128 threads) owns 64 rows, warp w rows 16w..16w+15,
// so the masking and softmax are the same as above; a CTA is one
// warpgroup (dq), two sharing K and V tiles (the forward) or a producer
// and two consumers sharing Q and dout tiles (dk/dv). The products are
// issued as warpgroup MMAs m64nNk16 reading their B
// operand (and, for QKᵀ-like products, their A operand) straight from shared
// memory, with fp32 accumulators in registers whose per-warp layout is the
// m16n8k16 C layout (s[NT][4] above).
//
// Shared tiles use the 128-byte swizzle of the wgmma descriptors: a tile of
// R rows of D 16-bit elements is D/64 column blocks ("atoms") of R rows of
// 128 bytes, atom a at a·R·128 bytes, and 16-byte chunk c of a row r of an
// atom sits at r·128 + ((c ^ (r mod 8))·16). Tiles start 1024-byte aligned.
// One tile serves as a K-major operand (rows are M or N, the head dim is K:
// Q, K, dout and V in QKᵀ-like products) and as an MN-major one (rows are
// K, the head dim is N: V in PV, K in dS·K, Q and dout in the dk/dv sums).
// Data arrive through cp.async (fa_cp16), which writes through the generic
// proxy: each thread fences it for the async proxy before the barrier (or
// mbarrier arrival) that publishes a tile to the tensor cores.
// ---------------------------------------------------------------------------

#define WG_BM 128  // query rows per forward CTA: two warpgroups of 64
// WG_BN is the keys per tile in the forward. At 64 a head-dim-128 CTA's
// tiles take 97 KB of shared memory, so two CTAs share an SM and one's
// softmax can overlap the other's products; at 128 (161 KB, one CTA an SM)
// that forward ran at 239 TFLOP/s against 282 (H100, BenchmarkOps).
#define WG_BN 64
#define WG_THREADS 256  // threads per forward CTA



// wg_ss issues d = A·B over the head dim (D/16 k-steps) for two K-major
// tiles: A, 64 rows at a of a tile of RA rows, and B, a tile of N rows at b.
template <int D, int RA, int N, bool F16>
__device__ __forceinline__ void wg_ss(float (*d)[4], u32 a, u32 b) {
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    if constexpr (N == 64) wg_ss64<F16, 0>(&d[0][0], wg_kmajor<RA>(a, kk), wg_kmajor<N>(b, kk), kk);
    else wg_ss128<F16, 0>(&d[0][0], wg_kmajor<RA>(a, kk), wg_kmajor<N>(b, kk), kk);
  }
}
// wg_rs issues d += P·B for P (64 x K) in packed 16-bit A fragments
// a[K/16][4] (fa_frag) and B the MN-major tile of K rows (and D columns) at
// b. The fragments must be written before the wg_fence that precedes this.
template <int D, int K, bool F16>
__device__ __forceinline__ void wg_rs(float (*d)[4], u32 (*a)[4], u32 b) {
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++) {
    if constexpr (D == 64) wg_rs64<F16, 1>(&d[0][0], a[kk], wg_mnmajor<K>(b, kk), 1);
    else wg_rs128<F16, 1>(&d[0][0], a[kk], wg_mnmajor<K>(b, kk), 1);
  }
}
// wg_pack packs fp32 fragments p[K/8][4] into A fragments a[K/16][4].
template <int K, bool F16>
__device__ __forceinline__ void wg_pack(float (*p)[4], u32 (*a)[4]) {
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++) fa_frag<F16>(p, kk, a[kk]);
}

// wg_load issues cp.async (by the CTA's NTH threads) for rows
// [r0, r0+N) of head h of a [T,H,D] tensor into the swizzled tile at shared
// address base, zero-filling rows outside [0,t).
template <int D, int N, int NTH>
__device__ __forceinline__ void wg_load(u32 base, const u16* src, int r0, int t, int heads, int h) {
  constexpr int CH = D / 8;
#pragma unroll
  for (int e = threadIdx.x; e < N * CH; e += NTH) {
    int r = e / CH, c = e - r * CH, i = r0 + r;
    bool ok = i >= 0 && i < t;
    const u16* p = ok ? src + ((i64)i * heads + h) * D + c * 8 : src;
    fa_cp16(base + (u32)((c >> 3) * N * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4)), p, ok);
  }
}


// wg_fwd_tiles runs the forward's ntiles key tiles from kmin for a CTA of
// two warpgroups (wg_fwd, wg_fwd_spans) whose Q rows and first K and V
// tiles are being loaded: the loads of tile n+1 (rows below tk) are issued
// before the products of tile n. Row ia of this lane sees keys [sta, ia],
// row ib keys [stb, ib]. With SP (span attention) every tile is computed
// and masked; otherwise (causal) a warpgroup skips the tiles wholly after
// its last row gi1, and a tile is masked only when it reaches past the
// warp's first row wi0, starts before the start wst1 of its last row, or
// the warp has rows at or past t.
template <int D, bool F16, bool SP>
__device__ __forceinline__ void wg_fwd_tiles(u32 Qg, u32 Ks, u32 Vs, const u16* k, const u16* v, int kmin, int ntiles,
                                             int tk, int hkv, int hk, int gi1, int wi0, int wst1, int t, int c,
                                             int sta, int ia, int stb, int ib, float sl2, float (*o)[4], float& ma,
                                             float& mb, float& la, float& lb) {
  constexpr int ND = D / 8, NT = WG_BN / 8, KT = WG_BN * D * 2;
  for (int n = 0; n < ntiles; n++) {
    int j0 = kmin + n * WG_BN;
    u32 kb = Ks + (n & 1) * KT, vb = Vs + (n & 1) * KT;
    if (n + 1 < ntiles) {
      wg_load<D, WG_BN, WG_THREADS>(Ks + ((n + 1) & 1) * KT, k, j0 + WG_BN, tk, hkv, hk);
      wg_load<D, WG_BN, WG_THREADS>(Vs + ((n + 1) & 1) * KT, v, j0 + WG_BN, tk, hkv, hk);
      fa_commit();
      fa_wait<1>();
    } else {
      fa_wait<0>();
    }
    wg_publish();
    __syncthreads();
    if (SP || j0 <= gi1) {
      float s[NT][4];
      wg_fence();
      wg_ss<D, WG_BM, WG_BN, F16>(s, Qg, kb);
      wg_commit();
      wg_wait<0>();
      wg_hold<NT>(s);
      bool need = SP || j0 + WG_BN - 1 > wi0 || j0 < wst1 || wi0 + 15 >= t;
      float ca, cb;
      fa_softmax<NT>(s, need, j0, c, sta, ia, stb, ib, sl2, ma, mb, la, lb, ca, cb);
      fa_rescale<ND>(o, ca, cb);
      u32 pf[NT / 2][4];
      wg_pack<WG_BN, F16>(s, pf);
      wg_hold<ND>(o);
      wg_fence();
      wg_rs<D, WG_BN, F16>(o, pf, vb);
      wg_commit();
      wg_wait<0>();
      wg_hold<ND>(o);
    }
    __syncthreads();  // every warpgroup is done with tile n's buffers
  }
}

// wg_fwd_store writes the forward's rows: this warp's 16 rows from wi0 of
// out (rows below t, staged in the K and V buffers, free now and
// contiguous: at head dim 128 the 128 padded rows take 34 KB, more than the
// K buffers' 32, with fa_stage's padded layout) and the lse of this lane's
// rows ia and ib.
template <int D, bool F16>
__device__ __forceinline__ void wg_fwd_store(u16* out, float* lse, u16* sm, int warp, int c, float (*o)[4], float ma,
                                             float mb, float la, float lb, int wi0, int ia, int ib, int t, int hq,
                                             int h) {
  la = quad_sum(la);
  lb = quad_sum(lb);
  u16* st = sm + WG_BM * D;
  fa_stage<D, F16>(st, warp, o, la > 0.0f ? 1.0f / la : 0.0f, lb > 0.0f ? 1.0f / lb : 0.0f);
  __syncwarp();
  fa_store_rows<D>(out, st, warp, wi0, t, hq, h);
  if (c == 0) {
    if (ia < t) lse[(i64)h * t + ia] = (ma + log2f(la)) * FA_LN2;
    if (ib < t) lse[(i64)h * t + ib] = (mb + log2f(lb)) * FA_LN2;
  }
}

// wg_fwd: as fa_fwd for a CTA of two warpgroups, 128 query rows [q0,
// q0+128) of head blockIdx.y, warpgroup g owning rows 64g..64g+63; both
// read the same K and V tiles of WG_BN keys, which have two buffers each
// (wg_fwd_tiles). A warpgroup skips a tile wholly after its last row.
template <int D, bool F16>
__device__ __forceinline__ void wg_fwd(u16* out, float* lse, const u16* q, const u16* k, const u16* v, const int* cu,
                                       int ns1, int t, int hq, int hkv, float scale, const int* order) {
  constexpr int ND = D / 8, KT = WG_BN * D * 2;
  u32 Qs;
  u16* sm = wg_smem(Qs);
  u32 Ks = Qs + WG_BM * D * 2, Vs = Ks + 2 * KT;
  int h = blockIdx.x % hq, hk = h / (hq / hkv);
  int q0 = order[blockIdx.x / hq] * WG_BM;  // the heaviest blocks first (k_attn_order)
  int grp = threadIdx.x >> 7, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  int qlast = min(q0 + WG_BM - 1, t - 1);
  int kmin = seq_start(cu, ns1, q0);
  int ntiles = (qlast - kmin) / WG_BN + 1;
  wg_load<D, WG_BM, WG_THREADS>(Qs, q, q0, t, hq, h);
  wg_load<D, WG_BN, WG_THREADS>(Ks, k, kmin, t, hkv, hk);
  wg_load<D, WG_BN, WG_THREADS>(Vs, v, kmin, t, hkv, hk);
  fa_commit();

  int gi1 = min(q0 + 64 * grp + 63, t - 1);  // last valid row of the warpgroup
  FaRows r = fa_rows(cu, ns1, t, q0 + warp * 16, g);
  u32 Qg = Qs + grp * 64 * 128;  // the warpgroup's rows in every atom

  float o[ND][4] = {};
  float ma = -F_INF, mb = -F_INF, la = 0.0f, lb = 0.0f;
  wg_fwd_tiles<D, F16, false>(Qg, Ks, Vs, k, v, kmin, ntiles, t, hkv, hk, gi1, r.wi0, r.wst1, t, c, r.sta, r.ea, r.stb,
                              r.eb, scale * FA_LOG2E, o, ma, mb, la, lb);
  wg_fwd_store<D, F16>(out, lse, sm, warp, c, o, ma, mb, la, lb, r.wi0, r.ia, r.ib, t, hq, h);
}

// wg_range sets lo and end, in shared memory, to the smallest start and
// the largest end of the non-empty ranges [r[2i], r[2i+1]) of rows
// [i0, min(i0+n, rows)), read by threads 0..n−1 (lo = lim and end = 0
// when there is none); every thread of the CTA calls it.
__device__ __forceinline__ void wg_range(int* lo_end, const int* r, int i0, int n, int rows, int lim, int& lo,
                                         int& end) {
  if (threadIdx.x == 0) {
    lo_end[0] = lim;
    lo_end[1] = 0;
  }
  __syncthreads();
  int i = i0 + (int)threadIdx.x;
  if ((int)threadIdx.x < n && i < rows && r[2 * i] < r[2 * i + 1]) {
    atomicMin(&lo_end[0], r[2 * i]);
    atomicMax(&lo_end[1], r[2 * i + 1]);
  }
  __syncthreads();
  lo = lo_end[0];
  end = lo_end[1];
}

// wg_fwd_spans is wg_fwd for span attention (context parallelism's ring
// blocks, see k_attn_spans_fwd): query row i of q [tq] sees keys
// [qk[2i], qk[2i+1]) of k and v [tk], and no key when that range is empty
// (out 0, lse −Inf). The CTA's 128 rows take the key tiles from the
// smallest start to the largest end of their ranges, each tile masked.
template <int D, bool F16>
__device__ __forceinline__ void wg_fwd_spans(u16* out, float* lse, const u16* q, const u16* k, const u16* v,
                                             const int* qk, int tq, int tk, int hq, int hkv, float scale) {
  constexpr int ND = D / 8, KT = WG_BN * D * 2;
  __shared__ int krange[2];
  u32 Qs;
  u16* sm = wg_smem(Qs);
  u32 Ks = Qs + WG_BM * D * 2, Vs = Ks + 2 * KT;
  int h = blockIdx.x % hq, hk = h / (hq / hkv);
  int q0 = (blockIdx.x / hq) * WG_BM;
  int grp = threadIdx.x >> 7, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  int kmin, kend;
  wg_range(krange, qk, q0, WG_BM, tq, tk, kmin, kend);
  int ntiles = kend > kmin ? (kend - kmin + WG_BN - 1) / WG_BN : 0;
  wg_load<D, WG_BM, WG_THREADS>(Qs, q, q0, tq, hq, h);
  if (ntiles > 0) {
    wg_load<D, WG_BN, WG_THREADS>(Ks, k, kmin, tk, hkv, hk);
    wg_load<D, WG_BN, WG_THREADS>(Vs, v, kmin, tk, hkv, hk);
  }
  fa_commit();

  int wi0 = q0 + warp * 16;
  int ia = wi0 + g, ib = ia + 8;
  // fa_softmax's mask keeps keys [st, last]: a row's [lo, hi) is
  // [lo, hi − 1], and a row in no span (or past tq) keeps none.
  int sta = 0, lasta = -1, stb = 0, lastb = -1;
  if (ia < tq) {
    sta = qk[2 * ia];
    lasta = qk[2 * ia + 1] - 1;
  }
  if (ib < tq) {
    stb = qk[2 * ib];
    lastb = qk[2 * ib + 1] - 1;
  }
  float sl2 = scale * FA_LOG2E;
  u32 Qg = Qs + grp * 64 * 128;

  float o[ND][4];
#pragma unroll
  for (int dt = 0; dt < ND; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float ma = -F_INF, mb = -F_INF, la = 0.0f, lb = 0.0f;
  wg_fwd_tiles<D, F16, true>(Qg, Ks, Vs, k, v, kmin, ntiles, tk, hkv, hk, 0, wi0, 0, tq, c, sta, lasta, stb, lastb,
                             sl2, o, ma, mb, la, lb);
  fa_wait<0>();  // with no tile, the Q load
  wg_fwd_store<D, F16>(out, lse, sm, warp, c, o, ma, mb, la, lb, wi0, ia, ib, tq, hq, h);
}

// tma_tile loads rows [r0, r0+R) of head h through tm into the swizzled
// tile at base (D/64 boxes, one an atom).
template <int D, int R>
__device__ __forceinline__ void tma_tile(u32 base, const TMap* tm, int r0, int h, u32 bar) {
#pragma unroll
  for (int a = 0; a < D / 64; a++) tma_load3(base + (u32)(a * R * 128), tm, a * 64, h, r0, bar);
}
// cp_arrive has mbarrier bar receive this thread's arrival once its
// cp.async copies issued so far have landed (the arrival counts against
// the barrier's expected count).
__device__ __forceinline__ void cp_arrive(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

// wg_dq_tiles runs the dq pass's ntiles key tiles from kmin for a CTA of
// one warpgroup (wg_dq, wg_dq_spans) whose Q, dout and first K and V tiles
// are being loaded (rows of K and V below tk), and stores its dq rows
// (below t). Row ia of this lane sees keys [sta, ia], row ib keys [stb,
// ib]; La, Lb are their lse·log2(e), Da, Db their delta. With SP every
// tile is masked; otherwise a tile is masked only when it reaches past the
// warp's first row wi0, starts before the start wst1 of its last row, or
// the warp has rows at or past t.
//
// With TMA the K and V tiles come through the tensor maps tk and tv: thread
// 0 issues each tile's copy once every warp is done with the buffer, and
// the copy completes the buffer's mbarrier (bars: K's, then V's) by its
// byte count; Q and dout still come by cp.async, waited for before the
// first tile.
template <int D, bool F16, bool SP, bool TMA = false>
__device__ __forceinline__ void wg_dq_tiles(u16* dq, u16* sm, u32 Qs, u32 Gs, u32 Ks, u32 Vs, const u16* k,
                                            const u16* v, int kmin, int ntiles, int tk, int hkv, int hk, int wi0,
                                            int wst1, int t, int hq, int h, int warp, int c, int sta, int ia, int stb,
                                            int ib, float sl2, float La, float Lb, float Da, float Db, float scale,
                                            const TMap* tmk = nullptr, const TMap* tmv = nullptr, u32 bars = 0) {
  constexpr int ND = D / 8, BN = 64, NT = BN / 8, TILE = BN * D * 2;
  float acc[ND][4] = {};

  for (int n = 0; n < ntiles; n++) {
    int j0 = kmin + n * BN;
    if (TMA) {
      if (n == 0) {
        fa_wait<0>();  // Q and dout
        wg_publish();
        __syncthreads();
      }
      mb_wait(bars, n & 1);      // K(n)
      mb_wait(bars + 8, n & 1);  // V(n)
    } else {
      fa_wait<0>();  // K(n) and V(n)
      wg_publish();
      __syncthreads();
    }
    float s[NT][4], dp[NT][4];
    wg_fence();
    wg_ss<D, 64, BN, F16>(s, Qs, Ks);
    wg_ss<D, 64, BN, F16>(dp, Gs, Vs);
    wg_commit();
    wg_wait<0>();
    wg_hold<NT>(s);
    wg_hold<NT>(dp);
    bool need = SP || j0 + BN - 1 > wi0 || j0 < wst1 || wi0 + 15 >= t;
    fa_ds_rows<NT, true>(s, dp, need, j0, c, sta, ia, stb, ib, sl2, La, Lb, Da, Db);
    __syncthreads();  // every warp is done with V(n)
    if (n + 1 < ntiles) {
      if (!TMA) {
        wg_load<D, BN, 128>(Vs, v, j0 + BN, tk, hkv, hk);
        fa_commit();
      } else if (threadIdx.x == 0) {
        mb_expect(bars + 8, (u32)TILE);
        tma_tile<D, BN>(Vs, tmv, j0 + BN, hk, bars + 8);
      }
    }
    u32 pf[NT / 2][4];
    wg_pack<BN, F16>(s, pf);
    wg_hold<ND>(acc);
    wg_fence();
    wg_rs<D, BN, F16>(acc, pf, Ks);
    wg_commit();
    wg_wait<0>();
    wg_hold<ND>(acc);
    __syncthreads();  // every warp is done with K(n)
    if (n + 1 < ntiles) {
      if (!TMA) {
        wg_load<D, BN, 128>(Ks, k, j0 + BN, tk, hkv, hk);
        fa_commit();
      } else if (threadIdx.x == 0) {
        mb_expect(bars, (u32)TILE);
        tma_tile<D, BN>(Ks, tmk, j0 + BN, hk, bars);
      }
    }
  }
  if (SP) fa_wait<0>();  // with no tile, the Q and dout loads
  // Stage the rows in the K and V buffers (free now, 2 tiles ≥ 64·(D+8)).
  u16* st = sm + 2 * 64 * D;
  fa_stage<D, F16>(st, warp, acc, scale, scale);
  __syncwarp();
  fa_store_rows<D>(dq, st, warp, wi0, t, hq, h);
}

// wg_dq: as fa_bwd_dq (one warpgroup, 64 query rows, 64-key tiles).
// Shared: Q, dout, K, V (64 rows each). (A CTA of two warpgroups sharing
// double-buffered K and V tiles, in lockstep, ran slower on the H100.)
//
// With TMA (k_ws_dq_*) the K and V tiles come through the tensor maps tmk
// and tmv (wg_dq_tiles).
template <int D, bool F16, bool TMA = false>
__device__ __forceinline__ void wg_dq(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k,
                                      const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale,
                                      const int* order, const TMap* tmk = nullptr, const TMap* tmv = nullptr) {
  constexpr int BN = 64, TILE = 64 * D * 2;
  __shared__ __align__(8) unsigned long long dq_bars[2];
  u32 Qs;
  u16* sm = wg_smem(Qs);
  u32 Gs = Qs + TILE, Ks = Gs + TILE, Vs = Ks + TILE;
  u32 bars = fa_smem(dq_bars);
  int h = blockIdx.x % hq, hk = h / (hq / hkv);
  int q0 = order[blockIdx.x / hq] * 64;  // the heaviest blocks first (k_attn_order)
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  int qlast = min(q0 + 63, t - 1);
  int kmin = seq_start(cu, ns1, q0);
  int ntiles = (qlast - kmin) / BN + 1;
  wg_load<D, 64, 128>(Qs, q, q0, t, hq, h);
  wg_load<D, 64, 128>(Gs, dout, q0, t, hq, h);
  if (TMA) {
    if (threadIdx.x == 0) {
      mb_init(bars, 1);
      mb_init(bars + 8, 1);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      mb_expect(bars, (u32)TILE);
      tma_tile<D, BN>(Ks, tmk, kmin, hk, bars);
      mb_expect(bars + 8, (u32)TILE);
      tma_tile<D, BN>(Vs, tmv, kmin, hk, bars + 8);
    }
  } else {
    wg_load<D, BN, 128>(Ks, k, kmin, t, hkv, hk);
    wg_load<D, BN, 128>(Vs, v, kmin, t, hkv, hk);
  }
  fa_commit();

  int wi0 = q0 + warp * 16;
  int wi1 = min(wi0 + 15, t - 1);
  int ia = wi0 + g, ib = ia + 8;
  int sta = ia < t ? seq_start(cu, ns1, ia) : t;
  int stb = ib < t ? seq_start(cu, ns1, ib) : t;
  int wst1 = wi1 >= wi0 ? seq_start(cu, ns1, wi1) : t;
  float sl2 = scale * FA_LOG2E;
  float La = ia < t ? lse[(i64)h * t + ia] * FA_LOG2E : 0.0f;
  float Lb = ib < t ? lse[(i64)h * t + ib] * FA_LOG2E : 0.0f;
  float Da = ia < t ? fa_delta<D>(dq, ia, hq, h) : 0.0f;
  float Db = ib < t ? fa_delta<D>(dq, ib, hq, h) : 0.0f;
  wg_dq_tiles<D, F16, false, TMA>(dq, sm, Qs, Gs, Ks, Vs, k, v, kmin, ntiles, t, hkv, hk, wi0, wst1, t, hq, h, warp, c,
                                  sta, ia, stb, ib, sl2, La, Lb, Da, Db, scale, tmk, tmv, bars);
}

// wg_dq_spans is wg_dq for span attention (k_attn_spans_bwd_dq's
// contract): query row i of q [tq] sees keys [qk[2i], qk[2i+1]) of k and v
// [tk]; a row in no span gets dq 0. delta is in the first 4 bytes of each
// dq row (k_wg_spans_pre_*).
template <int D, bool F16>
__device__ __forceinline__ void wg_dq_spans(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k,
                                            const u16* v, const int* qk, int tq, int tk, int hq, int hkv,
                                            float scale) {
  constexpr int BN = 64, TILE = 64 * D * 2;
  __shared__ int krange[2];
  u32 Qs;
  u16* sm = wg_smem(Qs);
  u32 Gs = Qs + TILE, Ks = Gs + TILE, Vs = Ks + TILE;
  int h = blockIdx.x % hq, hk = h / (hq / hkv);
  int q0 = (blockIdx.x / hq) * 64;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  int kmin, kend;
  wg_range(krange, qk, q0, 64, tq, tk, kmin, kend);
  int ntiles = kend > kmin ? (kend - kmin + BN - 1) / BN : 0;
  wg_load<D, 64, 128>(Qs, q, q0, tq, hq, h);
  wg_load<D, 64, 128>(Gs, dout, q0, tq, hq, h);
  if (ntiles > 0) {
    wg_load<D, BN, 128>(Ks, k, kmin, tk, hkv, hk);
    wg_load<D, BN, 128>(Vs, v, kmin, tk, hkv, hk);
  }
  fa_commit();

  int wi0 = q0 + warp * 16;
  int ia = wi0 + g, ib = ia + 8;
  int sta = 0, lasta = -1, stb = 0, lastb = -1;  // keys [st, last], as in wg_fwd_spans
  float La = 0.0f, Lb = 0.0f, Da = 0.0f, Db = 0.0f;
  if (ia < tq) {
    sta = qk[2 * ia];
    lasta = qk[2 * ia + 1] - 1;
    La = lse[(i64)h * tq + ia] * FA_LOG2E;
    Da = fa_delta<D>(dq, ia, hq, h);
  }
  if (ib < tq) {
    stb = qk[2 * ib];
    lastb = qk[2 * ib + 1] - 1;
    Lb = lse[(i64)h * tq + ib] * FA_LOG2E;
    Db = fa_delta<D>(dq, ib, hq, h);
  }
  // A row in no span has lse −Inf: every probability is masked before it
  // is used.
  if (lasta < sta) La = 0.0f;
  if (lastb < stb) Lb = 0.0f;
  wg_dq_tiles<D, F16, true>(dq, sm, Qs, Gs, Ks, Vs, k, v, kmin, ntiles, tk, hkv, hk, wi0, 0, tq, hq, h, warp, c, sta,
                            lasta, stb, lastb, scale * FA_LOG2E, La, Lb, Da, Db, scale);
}

#define WG_DKV_STAGES 3

template <int D, bool F16, bool SP>
__device__ __forceinline__ void wg_dkv_consume(u16* dk, u16* dv, u32 Ks, u32 Vs, u32 Qs, u32 Gs, const float* Ls,
                                               const float2* DSs, u32 bars, u16* sm, int k0, int q0, int total,
                                               int nqt, int t, int tk, const int* kq, int hkv, float scale);

template <int D, bool F16, bool SP, bool TMA>
__device__ __forceinline__ void wg_dkv_run(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse,
                                           const u16* q, const u16* k, const u16* v, const int* kq, int k0, int q0,
                                           int nqt, int t, int tk, int hq, int hkv, float scale, const TMap* tq,
                                           const TMap* tg);

// wg_rows_cp copies, with cp.async, this thread's query row of the dk/dv
// producer's buffer b (row i0 + threadIdx.x of head h): its lse into La
// and its delta and sequence start (the first 8 bytes of its dq row,
// fa_bwd_pre) into DSa; zeros past t.
template <int D, int BN>
__device__ __forceinline__ void wg_rows_cp(u32 La, u32 DSa, int b, int i0, int t, int h, int hq, const float* lse,
                                           const u16* dq) {
  int i = i0 + threadIdx.x;
  bool ok = i < t;
  fa_cp4(La + 4u * (u32)(b * BN + threadIdx.x), ok ? lse + (i64)h * t + i : lse, ok);
  fa_cp8(DSa + 8u * (u32)(b * BN + threadIdx.x), ok ? dq + ((i64)i * hq + h) * D : dq, ok);
}

// wg_dkv: as fa_bwd_dkv for a CTA of three warpgroups: a producer and two
// consumers. Consumer g (warpgroups 1 and 2) owns keys 64g..64g+63 of the
// CTA's 128 keys [k0, k0+128) of kv head blockIdx.y; both read the same
// 64-row tiles of Q and dout, the rows' lse and their delta and sequence
// start (the first 8 bytes of dq's rows: fa_bwd_pre), which the producer
// copies asynchronously into WG_DKV_STAGES buffers: each buffer has a
// "full" mbarrier (the producer arrives once its copies into it have landed
// and been fenced for the tensor cores) and an "empty" one (every consumer
// thread arrives when done with it), so the consumers never wait for each
// other and the loads run ahead of them. The producer gives its registers
// to the consumers (setmaxnreg). A consumer skips a query tile none of its
// keys is seen by. With TMA one producer thread has the Tensor Memory
// Accelerator copy the Q and dout tiles through the tensor maps tq and tg
// (as ws_fwd does), and the producer's first 64 threads copy the rows'
// lse, delta and start with cp.async, each arriving on the buffer's "full"
// mbarrier once its copies land: a buffer is published as soon as it is
// filled, not once the next one's copies are issued.
template <int D, bool F16, bool TMA = false>
__device__ __forceinline__ void wg_dkv(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q,
                                       const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv,
                                       float scale, const int* order, const TMap* tq = nullptr,
                                       const TMap* tg = nullptr) {
  constexpr int BN = 64;
  int k0 = order[blockIdx.x / hkv] * 128;  // the heaviest blocks first (k_attn_order)
  int klast = min(k0 + 127, t - 1);
  int qend = seq_end(cu, ns1, klast, t);
  int nqt = (qend - k0 + BN - 1) / BN;
  wg_dkv_run<D, F16, false, TMA>(dk, dv, dq, dout, lse, q, k, v, nullptr, k0, k0, nqt, t, t, hq, hkv, scale, tq, tg);
}

// wg_dkv_spans is wg_dkv for span attention (k_attn_spans_bwd_dkv's
// contract): key row j of k and v [tk] is seen by query rows [kq[2j],
// kq[2j+1]) of q [tq]; a key in no span gets dk and dv 0. The CTA's keys
// take the query tiles from the smallest start to the largest end of
// their ranges, each tile masked. delta is in the first 4 bytes of each dq
// row (k_wg_spans_pre_*).
template <int D, bool F16>
__device__ __forceinline__ void wg_dkv_spans(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse,
                                             const u16* q, const u16* k, const u16* v, const int* kq, int tq, int tk,
                                             int hq, int hkv, float scale) {
  constexpr int BN = 64;
  __shared__ int qrange[2];
  int k0 = (blockIdx.x / hkv) * 128;
  int qmin, qend;
  wg_range(qrange, kq, k0, 128, tk, tq, qmin, qend);
  int nqt = qend > qmin ? (qend - qmin + BN - 1) / BN : 0;
  wg_dkv_run<D, F16, true, false>(dk, dv, dq, dout, lse, q, k, v, kq, k0, qmin, nqt, tq, tk, hq, hkv, scale, nullptr,
                                   nullptr);
}

// wg_dkv_run is the body of wg_dkv and wg_dkv_spans once the CTA's keys
// [k0, k0+128) (rows of k and v below tk) and its query tiles are known:
// nqt tiles of 64 rows from q0 (rows of q below t) for each query head of
// the group.
template <int D, bool F16, bool SP, bool TMA>
__device__ __forceinline__ void wg_dkv_run(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse,
                                           const u16* q, const u16* k, const u16* v, const int* kq, int k0, int q0,
                                           int nqt, int t, int tk, int hq, int hkv, float scale, const TMap* tq,
                                           const TMap* tg) {
  constexpr int BN = 64, NS = WG_DKV_STAGES, KT = 128 * D * 2, QT = BN * D * 2;
  u32 Ks;
  u16* sm = wg_smem(Ks);
  u32 Vs = Ks + KT, Qs = Vs + KT, Gs = Qs + NS * QT;
  float* Ls = (float*)(sm + (2 * KT + 2 * NS * QT) / 2);  // lse[NS][BN]
  float2* DSs = (float2*)(Ls + NS * BN);                     // {delta, start}[NS][BN]
  u32 La = fa_smem(Ls), DSa = fa_smem(DSs);
  u32 bars = fa_smem(DSs + NS * BN);  // full[NS], then empty[NS]
  int hk = blockIdx.x % hkv, group = hq / hkv;
  int total = group * nqt;

  if (threadIdx.x == 0) {
    for (int i = 0; i < NS; i++) {
      mb_init(bars + 8 * i, TMA ? BN + 1 : 128);  // the producer's threads (with TMA: the copies' and 64 rows')
      mb_init(bars + 8 * (NS + i), 256);          // the consumers' threads
    }
    if (TMA) asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  wg_load<D, 128, 384>(Ks, k, k0, tk, hkv, hk);
  wg_load<D, 128, 384>(Vs, v, k0, tk, hkv, hk);
  fa_commit();
  fa_wait<0>();
  wg_publish();
  __syncthreads();

  if (TMA && threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x < BN) {
      for (int n = 0; n < total; n++) {
        int b = n % NS;
        u32 full = bars + 8 * b;
        if (n >= NS) mb_wait(bars + 8 * (NS + b), (n / NS + 1) & 1);
        int h = hk * group + n / nqt, i0 = q0 + (n % nqt) * BN;
        if (threadIdx.x == 0) {
          mb_expect(full, (u32)(2 * QT));
          tma_tile<D, BN>(Qs + b * QT, tq, i0, h, full);
          tma_tile<D, BN>(Gs + b * QT, tg, i0, h, full);
        }
        wg_rows_cp<D, BN>(La, DSa, b, i0, t, h, hq, lse, dq);
        cp_arrive(full);
      }
    }
  } else if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    for (int n = 0; n < total; n++) {
      int b = n % NS;
      if (n >= NS) mb_wait(bars + 8 * (NS + b), (n / NS + 1) & 1);
      int h = hk * group + n / nqt, i0 = q0 + (n % nqt) * BN;
      wg_load<D, BN, 128>(Qs + b * QT, q, i0, t, hq, h);
      wg_load<D, BN, 128>(Gs + b * QT, dout, i0, t, hq, h);
      if (threadIdx.x < BN) wg_rows_cp<D, BN>(La, DSa, b, i0, t, h, hq, lse, dq);
      fa_commit();
      if (n >= 1) {
        fa_wait<1>();
        wg_publish();
        mb_arrive(bars + 8 * ((n - 1) % NS));
      }
    }
    fa_wait<0>();
    wg_publish();
    if (!SP || total > 0) mb_arrive(bars + 8 * ((total - 1) % NS));
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    wg_dkv_consume<D, F16, SP>(dk, dv, Ks, Vs, Qs, Gs, Ls, DSs, bars, sm, k0, q0, total, nqt, t, tk, kq, hkv, scale);
  }
}

// wg_ds_cols_m is wg_ds_cols (below) with its mask decided at compile
// time (MASK): with it decided inside the loop, a tile that needs no mask
// ran a branch a score.
template <int NT, bool MASK>
__device__ __forceinline__ void wg_ds_cols_m(float (*s)[4], float (*dp)[4], int i0, int t, int c, int ja,
                                             int jb, const float* L, const float2* DS, float sl2) {
#pragma unroll
  for (int nt = 0; nt < NT; nt++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int ci = nt * 8 + 2 * c + (e & 1);
      float2 ds = DS[ci];
      bool ok = true;
      if (MASK) {
        int i = i0 + ci, j = e < 2 ? ja : jb;
        ok = i < t && j <= i && j >= __float_as_int(ds.y);
      }
      float p = ok ? exp2_approx(__fmaf_rn(s[nt][e], sl2, -(L[ci] * FA_LOG2E))) : 0.0f;
      s[nt][e] = p;
      dp[nt][e] = p * (dp[nt][e] - ds.x);
    }
  }
}

// wg_ds_cols is fa_ds_cols for the wgmma dk/dv kernel, whose buffers hold
// each query row's lse (L[], natural log; zero past t) and its delta and
// sequence start (DS[]; zero past t, so rows at or past t are masked by
// index).
template <int NT>
__device__ __forceinline__ void wg_ds_cols(float (*s)[4], float (*dp)[4], bool need, int i0, int t, int c, int ja,
                                           int jb, const float* L, const float2* DS, float sl2) {
  if (need) {
    wg_ds_cols_m<NT, true>(s, dp, i0, t, c, ja, jb, L, DS, sl2);
  } else {
    wg_ds_cols_m<NT, false>(s, dp, i0, t, c, ja, jb, L, DS, sl2);
  }
}

// wg_ds_spans is wg_ds_cols for span attention: this lane's keys ja and
// jb are seen by query rows [qla, qza] and [qlb, qzb] (none when empty),
// every tile masked.
template <int NT>
__device__ __forceinline__ void wg_ds_spans(float (*s)[4], float (*dp)[4], int i0, int c, int qla, int qza, int qlb,
                                            int qzb, const float* L, const float2* DS, float sl2) {
#pragma unroll
  for (int nt = 0; nt < NT; nt++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int ci = nt * 8 + 2 * c + (e & 1);
      int i = i0 + ci;
      bool ok = e < 2 ? (i >= qla && i <= qza) : (i >= qlb && i <= qzb);
      float p = ok ? exp2_approx(__fmaf_rn(s[nt][e], sl2, -(L[ci] * FA_LOG2E))) : 0.0f;
      s[nt][e] = p;
      dp[nt][e] = p * (dp[nt][e] - DS[ci].x);
    }
  }
}

// wg_dkv_consume is the consumers' part of wg_dkv and wg_dkv_spans (SP):
// query tile n is rows q0 + (n mod nqt)·64 of q [t]; the keys are rows of k
// and v [tk]; with SP, key j is seen by query rows [kq[2j], kq[2j+1]).
template <int D, bool F16, bool SP>
__device__ __forceinline__ void wg_dkv_consume(u16* dk, u16* dv, u32 Ks, u32 Vs, u32 Qs, u32 Gs, const float* Ls,
                                               const float2* DSs, u32 bars, u16* sm, int k0, int q0, int total,
                                               int nqt, int t, int tk, const int* kq, int hkv, float scale) {
  constexpr int ND = D / 8, BN = 64, NT = BN / 8, NS = WG_DKV_STAGES, QT = BN * D * 2;
  int hk = blockIdx.x % hkv;
  int grp = (threadIdx.x >> 7) - 1, warp = (threadIdx.x >> 5) - 4, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  int gk0 = k0 + 64 * grp, gk1 = min(gk0 + 63, tk - 1);  // the warpgroup's keys
  int kw0 = k0 + warp * 16;
  int ja = kw0 + g, jb = ja + 8;
  int qla = 0, qza = -1, qlb = 0, qzb = -1;  // SP: the query rows keys ja and jb are seen by
  if (SP && ja < tk) {
    qla = kq[2 * ja];
    qza = kq[2 * ja + 1] - 1;
  }
  if (SP && jb < tk) {
    qlb = kq[2 * jb];
    qzb = kq[2 * jb + 1] - 1;
  }
  float sl2 = scale * FA_LOG2E;
  u32 Kg = Ks + grp * 64 * 128, Vg = Vs + grp * 64 * 128;
  float dka[ND][4], dva[ND][4];
#pragma unroll
  for (int dt = 0; dt < ND; dt++) {
    dka[dt][0] = dka[dt][1] = dka[dt][2] = dka[dt][3] = 0.0f;
    dva[dt][0] = dva[dt][1] = dva[dt][2] = dva[dt][3] = 0.0f;
  }

  for (int n = 0; n < total; n++) {
    int b = n % NS;
    int i0 = q0 + (n % nqt) * BN;
    mb_wait(bars + 8 * b, (n / NS) & 1);
    const float* L = Ls + b * BN;
    const float2* DS = DSs + b * BN;
    int st0 = __float_as_int(DS[0].y), stl = __float_as_int(DS[BN - 1].y);
    bool skip = SP ? gk0 >= tk : gk0 >= t || i0 + BN - 1 < gk0 || st0 > gk1;
    if (!skip) {
      u32 qb = Qs + b * QT, gb = Gs + b * QT;
      float s[NT][4], dp[NT][4];
      wg_fence();
      wg_ss<D, 128, BN, F16>(s, Kg, qb);
      wg_ss<D, 128, BN, F16>(dp, Vg, gb);
      wg_commit();
      wg_wait<0>();
      wg_hold<NT>(s);
      wg_hold<NT>(dp);
      if (SP) {
        wg_ds_spans<NT>(s, dp, i0, c, qla, qza, qlb, qzb, L, DS, sl2);
      } else {
        bool need = i0 < kw0 + 15 || stl > kw0 || i0 + BN > t;
        wg_ds_cols<NT>(s, dp, need, i0, t, c, ja, jb, L, DS, sl2);
      }
      u32 ap[NT / 2][4], ad[NT / 2][4];
      wg_pack<BN, F16>(s, ap);
      wg_pack<BN, F16>(dp, ad);
      wg_hold<ND>(dva);
      wg_hold<ND>(dka);
      wg_fence();
      wg_rs<D, BN, F16>(dva, ap, gb);
      wg_rs<D, BN, F16>(dka, ad, qb);
      wg_commit();
      wg_wait<0>();
      wg_hold<ND>(dva);
      wg_hold<ND>(dka);
    }
    mb_arrive(bars + 8 * (NS + b));
  }
  // Every consumer is done with every buffer (the producer wrote its last
  // one before they read it): stage dK and dV from the start of shared
  // memory.
  asm volatile("bar.sync 1, 256;" ::: "memory");
  u16* sk = sm;
  u16* sv = sm + 128 * (D + 8);
  fa_stage<D, F16>(sk, warp, dka, scale, scale);
  fa_stage<D, F16>(sv, warp, dva, 1.0f, 1.0f);
  __syncwarp();
  fa_store_rows<D>(dk, sk, warp, kw0, tk, hkv, hk);
  fa_store_rows<D>(dv, sv, warp, kw0, tk, hkv, hk);
}

// ---------------------------------------------------------------------------
// The forward, warp-specialised after FlashAttention-3: a CTA of three
// warpgroups owns 128 query rows of one head, as wg_fwd's does. A producer
// warpgroup, of which one thread works, has the Tensor Memory Accelerator
// copy Q and each tile of WS_BN keys of K and V into WS_STAGES buffers
// (bulk tensor copies through tensor maps the host encodes: rank 3,
// {D, heads, tokens}, boxes of 64 elements × 1 head × rows, with the
// 128-byte swizzle the wgmma descriptors read, and rows past the last
// token read as zeros). Each buffer has a "full" mbarrier, which the copies
// complete by their byte count, and an "empty" one, which every consumer
// thread arrives on once done with the buffer. The copies write through
// the async proxy the tensor cores read, so a tile is published as soon as
// it lands and needs no proxy fence. The producer gives its registers to
// the two consumers (setmaxnreg), each owning 64 rows, which overlap their
// softmax with their products: in each round a consumer issues Q·K(n)ᵀ and
// then P(n−1)·V(n−1), waits for the first alone and turns the scores of
// tile n into probabilities while the tensor cores still multiply those
// of tile n−1 into the output, which is rescaled once that product is
// done. With pp set the two consumers also take turns to issue their
// products (named barriers 2 and 3), so that one warpgroup's softmax runs
// while the other's products do.
// ---------------------------------------------------------------------------

#define WS_BN 128     // keys per tile
#define WS_STAGES 3   // K and V buffers
#define WS_THREADS 384 // a producer and two consumers

// wg_hold_a is wg_hold for packed A fragments.
template <int N>
__device__ __forceinline__ void wg_hold_a(u32 (*a)[4]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+r"(a[i][0]), "+r"(a[i][1]), "+r"(a[i][2]), "+r"(a[i][3])::"memory");
}

// ws_turn_wait and ws_turn_pass are the consumers' turns (named barriers 2
// and 3 of 256 threads): a warpgroup waits for its turn to issue products
// and passes it to the other once issued.
__device__ __forceinline__ void ws_turn_wait(int grp) {
  asm volatile("bar.sync %0, 256;" ::"r"(2 + grp) : "memory");
}
__device__ __forceinline__ void ws_turn_pass(int grp) {
  asm volatile("bar.arrive %0, 256;" ::"r"(3 - grp) : "memory");
}

template <int D, bool F16, bool SP, int BN, int NS>
__device__ __forceinline__ void ws_fwd_consume(u16* out, float* lse, u16* sm, u32 Qs, u32 Ks, u32 Vs, u32 bars,
                                               const int* cu, int ns1, const int* qk, int t, int hq, int h, int q0,
                                               int kmin, int ntiles, float scale, int pp);

// ws_fwd is the warp-specialised forward: as wg_fwd (the same grid, block
// order and results) for a CTA of WS_THREADS threads, reading q, k and v
// through the tensor maps tq, tk and tv. With SP it is span attention's
// (wg_fwd_spans' contract: query row i of t sees keys [qk[2i], qk[2i+1])
// of nk; blocks in index order; a CTA whose rows see no key takes one
// tile, wholly masked, so that it writes 0 and −Inf).
template <int D, bool F16, bool SP, int BN, int NS>
__device__ __forceinline__ void ws_fwd(u16* out, float* lse, const TMap* tq, const TMap* tk, const TMap* tv,
                                       const int* cu, int ns1, const int* qk, int t, int nk, int hq, int hkv,
                                       float scale, const int* order, int pp) {
  constexpr int KT = BN * D * 2, QT = WG_BM * D * 2;
  u32 Qs;
  u16* sm = wg_smem(Qs);
  u32 Ks = Qs + QT, Vs = Ks + NS * KT;
  u32 bars = Vs + NS * KT;  // full[NS], then empty[NS]
  int h = blockIdx.x % hq, hk = h / (hq / hkv);
  int q0, kmin, ntiles;
  if constexpr (SP) {
    __shared__ int krange[2];
    int kend;
    q0 = (blockIdx.x / hq) * WG_BM;
    wg_range(krange, qk, q0, WG_BM, t, nk, kmin, kend);
    ntiles = kend > kmin ? (kend - kmin + BN - 1) / BN : 0;
    if (ntiles == 0) kmin = 0, ntiles = 1;
  } else {
    q0 = order[blockIdx.x / hq] * WG_BM;  // the heaviest blocks first (k_attn_order)
    int qlast = min(q0 + WG_BM - 1, t - 1);
    kmin = seq_start(cu, ns1, q0);
    ntiles = (qlast - kmin) / BN + 1;
  }
  if (threadIdx.x == 0) {
    for (int i = 0; i < NS; i++) {
      mb_init(bars + 8 * i, 1);           // the producer's expect_tx
      mb_init(bars + 8 * (NS + i), 256);  // the consumers' threads
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x == 0) {
      for (int n = 0; n < ntiles; n++) {
        int b = n % NS;
        u32 full = bars + 8 * b;
        if (n >= NS) mb_wait(bars + 8 * (NS + b), (n / NS + 1) & 1);
        mb_expect(full, (u32)(2 * KT + (n == 0 ? QT : 0)));
        if (n == 0) tma_tile<D, WG_BM>(Qs, tq, q0, h, full);
        int j0 = kmin + n * BN;
        tma_tile<D, BN>(Ks + b * KT, tk, j0, hk, full);
        tma_tile<D, BN>(Vs + b * KT, tv, j0, hk, full);
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    ws_fwd_consume<D, F16, SP, BN, NS>(out, lse, sm, Qs, Ks, Vs, bars, cu, ns1, qk, t, hq, h, q0, kmin, ntiles, scale,
                                       pp);
  }
}

// ws_fwd_consume is the consumers' part of ws_fwd: warpgroup grp (0 or 1)
// owns rows q0+64grp.. and takes the CTA's ntiles key tiles from kmin,
// every one of them, so that no product is issued on a path that differs
// between the warpgroups (ptxas would serialise the products): the first
// warpgroup's rows mask the keys of a last tile that starts after them.
template <int D, bool F16, bool SP, int BN, int NS>
__device__ __forceinline__ void ws_fwd_consume(u16* out, float* lse, u16* sm, u32 Qs, u32 Ks, u32 Vs, u32 bars,
                                               const int* cu, int ns1, const int* qk, int t, int hq, int h, int q0,
                                               int kmin, int ntiles, float scale, int pp) {
  constexpr int ND = D / 8, NT = BN / 8, KT = BN * D * 2;
  int grp = (threadIdx.x >> 7) - 1, warp = (threadIdx.x >> 5) - 4, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  FaRows r = SP ? fa_span_rows(qk, t, q0 + warp * 16, g) : fa_rows(cu, ns1, t, q0 + warp * 16, g);
  float sl2 = scale * FA_LOG2E;
  u32 Qg = Qs + grp * 64 * 128;  // the warpgroup's rows in every atom

  float o[ND][4] = {};
  float ma = -F_INF, mb = -F_INF, la = 0.0f, lb = 0.0f;
  u32 pf[NT / 2][4];
  if (pp && grp == 1) ws_turn_pass(grp);  // the first consumer goes first

  // Tile 0: its scores alone.
  mb_wait(bars, 0);
  {
    float s[NT][4];
    if (pp) ws_turn_wait(grp);
    wg_fence();
    wg_ss<D, WG_BM, BN, F16>(s, Qg, Ks);
    wg_commit();
    if (pp) ws_turn_pass(grp);
    wg_wait<0>();
    wg_hold<NT>(s);
    bool need = SP || kmin + BN - 1 > r.wi0 || kmin < r.wst1 || r.wi0 + 15 >= t;
    float ca, cb;
    fa_softmax<NT>(s, need, kmin, c, r.sta, r.ea, r.stb, r.eb, sl2, ma, mb, la, lb, ca, cb);
    wg_pack<BN, F16>(s, pf);
  }
  // Round n: the scores of tile n and the output product of tile n−1.
  for (int n = 1; n < ntiles; n++) {
    int b = n % NS, pb = (n - 1) % NS;
    int j0 = kmin + n * BN;
    mb_wait(bars + 8 * b, (n / NS) & 1);
    float s[NT][4];
    if (pp) ws_turn_wait(grp);
    wg_hold<ND>(o);
    wg_hold_a<NT / 2>(pf);
    wg_fence();
    wg_ss<D, WG_BM, BN, F16>(s, Qg, Ks + b * KT);
    wg_commit();
    wg_rs<D, BN, F16>(o, pf, Vs + pb * KT);
    wg_commit();
    if (pp) ws_turn_pass(grp);
    wg_wait<1>();
    wg_hold<NT>(s);
    bool need = SP || j0 + BN - 1 > r.wi0 || j0 < r.wst1 || r.wi0 + 15 >= t;
    float ca, cb;
    fa_softmax<NT>(s, need, j0, c, r.sta, r.ea, r.stb, r.eb, sl2, ma, mb, la, lb, ca, cb);
    wg_wait<0>();
    wg_hold<ND>(o);
    wg_hold_a<NT / 2>(pf);
    mb_arrive(bars + 8 * (NS + pb));  // this thread is done with tile n−1
    fa_rescale<ND>(o, ca, cb);
    wg_pack<BN, F16>(s, pf);
  }
  // The last tile's output product.
  {
    int pb = (ntiles - 1) % NS;
    if (pp) ws_turn_wait(grp);
    wg_hold<ND>(o);
    wg_hold_a<NT / 2>(pf);
    wg_fence();
    wg_rs<D, BN, F16>(o, pf, Vs + pb * KT);
    wg_commit();
    if (pp) ws_turn_pass(grp);
    wg_wait<0>();
    wg_hold<ND>(o);
    mb_arrive(bars + 8 * (NS + pb));
  }
  // Both consumers are done with the K and V buffers, where the output is
  // staged.
  asm volatile("bar.sync 1, 256;" ::: "memory");
  wg_fwd_store<D, F16>(out, lse, sm, warp, c, o, ma, mb, la, lb, r.wi0, r.ia, r.ib, t, hq, h);
}

// Entry points, one per dtype and head dim (k_fa_<op>_<dtype>_<D>). They are
// spelled out because the host finds kernel names in this source text.

extern "C" __global__ void __launch_bounds__(128, 3) k_fa_fwd_bf16_64(u16* out, float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale) {
  fa_fwd<64, false>(out, lse, q, k, v, cu, ns1, t, hq, hkv, scale);
}
extern "C" __global__ void __launch_bounds__(128) k_fa_pre_bf16_64(u16* dq, const u16* dout, const u16* out, int rows, const int* cu, int ns1, int hq) {
  fa_bwd_pre<64, false>(dq, dout, out, rows, cu, ns1, hq);
}
extern "C" __global__ void __launch_bounds__(128, 3) k_fa_dq_bf16_64(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale) {
  fa_bwd_dq<64, false>(dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale);
}
extern "C" __global__ void __launch_bounds__(128) k_fa_dkv_bf16_64(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale) {
  fa_bwd_dkv<64, 64, false>(dk, dv, dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale);
}

extern "C" __global__ void __launch_bounds__(128, 3) k_fa_fwd_bf16_128(u16* out, float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale) {
  fa_fwd<128, false>(out, lse, q, k, v, cu, ns1, t, hq, hkv, scale);
}
extern "C" __global__ void __launch_bounds__(128) k_fa_pre_bf16_128(u16* dq, const u16* dout, const u16* out, int rows, const int* cu, int ns1, int hq) {
  fa_bwd_pre<128, false>(dq, dout, out, rows, cu, ns1, hq);
}
extern "C" __global__ void __launch_bounds__(128, 3) k_fa_dq_bf16_128(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale) {
  fa_bwd_dq<128, false>(dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale);
}
extern "C" __global__ void __launch_bounds__(128) k_fa_dkv_bf16_128(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale) {
  fa_bwd_dkv<128, 64, false>(dk, dv, dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale);
}

extern "C" __global__ void __launch_bounds__(128, 3) k_fa_fwd_f16_64(u16* out, float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale) {
  fa_fwd<64, true>(out, lse, q, k, v, cu, ns1, t, hq, hkv, scale);
}
extern "C" __global__ void __launch_bounds__(128) k_fa_pre_f16_64(u16* dq, const u16* dout, const u16* out, int rows, const int* cu, int ns1, int hq) {
  fa_bwd_pre<64, true>(dq, dout, out, rows, cu, ns1, hq);
}
extern "C" __global__ void __launch_bounds__(128, 3) k_fa_dq_f16_64(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale) {
  fa_bwd_dq<64, true>(dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale);
}
extern "C" __global__ void __launch_bounds__(128) k_fa_dkv_f16_64(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale) {
  fa_bwd_dkv<64, 64, true>(dk, dv, dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale);
}

extern "C" __global__ void __launch_bounds__(128, 3) k_fa_fwd_f16_128(u16* out, float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale) {
  fa_fwd<128, true>(out, lse, q, k, v, cu, ns1, t, hq, hkv, scale);
}
extern "C" __global__ void __launch_bounds__(128) k_fa_pre_f16_128(u16* dq, const u16* dout, const u16* out, int rows, const int* cu, int ns1, int hq) {
  fa_bwd_pre<128, true>(dq, dout, out, rows, cu, ns1, hq);
}
extern "C" __global__ void __launch_bounds__(128, 3) k_fa_dq_f16_128(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale) {
  fa_bwd_dq<128, true>(dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale);
}
extern "C" __global__ void __launch_bounds__(128) k_fa_dkv_f16_128(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale) {
  fa_bwd_dkv<128, 64, true>(dk, dv, dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale);
}

// The wgmma entry points (k_wg_<op>_<dtype>_<D>); compiled only for sm_90a
// (their bodies trap elsewhere; the host launches them only on sm_90a).
// k_attn_order writes the order in which the wgmma kernels take their
// blocks of rows rows (query blocks; key blocks with keys set): the nb
// blocks by decreasing work, ties by index, so that the heaviest start
// first and the light ones fill the tail (longest processing time first).
// In a causal varlen batch a block's work grows with its distance into its
// sequence (query blocks) or from its sequence's end (key blocks), so the
// index order leaves a long tail: with one CTA an SM of the dk/dv kernel,
// 8 sequences of 2048 tokens and 2 kv heads, the last CTA ends after 27
// tiles' time in index order and 17 in this one, the ideal being 16.5
// (bench/sched_model.py's list-scheduling model). A query block's work is
// the keys its last row sees from the start of its first row's sequence, a
// key block's the queries from its first key to its last key's sequence
// end. One CTA of 1024 threads sorts (bitonic, in shared memory) up to
// ORDER_MAX blocks; more are taken in the order that is heaviest first
// when every sequence is one: reverse index order for query blocks, index
// order for key blocks.
#define ORDER_MAX 16384
extern "C" __global__ void __launch_bounds__(1024) k_attn_order(const int* cu, int ns1, int t, int rows, int keys, int nb,
                                                                int* order) {
  extern __shared__ unsigned long long ord_sm[];
  if (nb > ORDER_MAX) {
    for (int i = threadIdx.x; i < nb; i += blockDim.x) order[i] = keys ? i : nb - 1 - i;
    return;
  }
  int n = 1;
  while (n < nb) n <<= 1;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    unsigned long long key = ~0ull;
    if (i < nb) {
      int r0 = i * rows, r1 = min(r0 + rows, t) - 1;
      int w = keys ? seq_end(cu, ns1, r1, t) - r0 : r1 - seq_start(cu, ns1, r0) + 1;
      key = ((unsigned long long)(unsigned)(0x7fffffff - w) << 32) | (unsigned)i;
    }
    ord_sm[i] = key;
  }
  __syncthreads();
  for (int k = 2; k <= n; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int p = i ^ j;
        if (p > i) {
          unsigned long long a = ord_sm[i], b = ord_sm[p];
          if ((a > b) == ((i & k) == 0)) {
            ord_sm[i] = b;
            ord_sm[p] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  for (int i = threadIdx.x; i < nb; i += blockDim.x) order[i] = (int)(ord_sm[i] & 0xffffffffu);
}

// The entry points are spelled out like the mma.sync ones above.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ONLY(x) x
#else
#define WG_ONLY(x) __trap()
#endif

extern "C" __global__ void __launch_bounds__(256, 2) k_wg_fwd_bf16_64(u16* out, float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order) {
  WG_ONLY((wg_fwd<64, false>(out, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order)));
}
extern "C" __global__ void __launch_bounds__(128) k_wg_dq_bf16_64(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order) {
  WG_ONLY((wg_dq<64, false>(dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_wg_dkv_bf16_64(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order) {
  WG_ONLY((wg_dkv<64, false>(dk, dv, dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order)));
}

extern "C" __global__ void __launch_bounds__(256, 2) k_wg_fwd_bf16_128(u16* out, float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order) {
  WG_ONLY((wg_fwd<128, false>(out, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order)));
}
extern "C" __global__ void __launch_bounds__(128) k_wg_dq_bf16_128(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order) {
  WG_ONLY((wg_dq<128, false>(dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_wg_dkv_bf16_128(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order) {
  WG_ONLY((wg_dkv<128, false>(dk, dv, dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order)));
}

extern "C" __global__ void __launch_bounds__(256, 2) k_wg_fwd_f16_64(u16* out, float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order) {
  WG_ONLY((wg_fwd<64, true>(out, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order)));
}
extern "C" __global__ void __launch_bounds__(128) k_wg_dq_f16_64(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order) {
  WG_ONLY((wg_dq<64, true>(dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_wg_dkv_f16_64(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order) {
  WG_ONLY((wg_dkv<64, true>(dk, dv, dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order)));
}

extern "C" __global__ void __launch_bounds__(256, 2) k_wg_fwd_f16_128(u16* out, float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order) {
  WG_ONLY((wg_fwd<128, true>(out, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order)));
}
extern "C" __global__ void __launch_bounds__(128) k_wg_dq_f16_128(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order) {
  WG_ONLY((wg_dq<128, true>(dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_wg_dkv_f16_128(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order) {
  WG_ONLY((wg_dkv<128, true>(dk, dv, dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order)));
}

// The warp-specialised forward (ws_fwd): 384 threads per 128 query rows
// and head, the tensor maps of q, k and v by value.
extern "C" __global__ void __launch_bounds__(384, 1) k_ws_fwd_bf16_64(u16* out, float* lse, const __grid_constant__ TMap tq, const __grid_constant__ TMap tk, const __grid_constant__ TMap tv, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order, int pp) {
  WG_ONLY((ws_fwd<64, false, false, WS_BN, WS_STAGES>(out, lse, &tq, &tk, &tv, cu, ns1, nullptr, t, t, hq, hkv, scale, order, pp)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_ws_fwd_bf16_128(u16* out, float* lse, const __grid_constant__ TMap tq, const __grid_constant__ TMap tk, const __grid_constant__ TMap tv, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order, int pp) {
  WG_ONLY((ws_fwd<128, false, false, WS_BN, WS_STAGES>(out, lse, &tq, &tk, &tv, cu, ns1, nullptr, t, t, hq, hkv, scale, order, pp)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_ws_fwd_f16_64(u16* out, float* lse, const __grid_constant__ TMap tq, const __grid_constant__ TMap tk, const __grid_constant__ TMap tv, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order, int pp) {
  WG_ONLY((ws_fwd<64, true, false, WS_BN, WS_STAGES>(out, lse, &tq, &tk, &tv, cu, ns1, nullptr, t, t, hq, hkv, scale, order, pp)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_ws_fwd_f16_128(u16* out, float* lse, const __grid_constant__ TMap tq, const __grid_constant__ TMap tk, const __grid_constant__ TMap tv, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order, int pp) {
  WG_ONLY((ws_fwd<128, true, false, WS_BN, WS_STAGES>(out, lse, &tq, &tk, &tv, cu, ns1, nullptr, t, t, hq, hkv, scale, order, pp)));
}

// The dq pass with its K and V tiles loaded by the TMA (wg_dq with TMA):
// the tensor maps of k and v by value after k_wg_dq_*'s arguments.
extern "C" __global__ void __launch_bounds__(128) k_ws_dq_bf16_64(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order, const __grid_constant__ TMap tk, const __grid_constant__ TMap tv) {
  WG_ONLY((wg_dq<64, false, true>(dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order, &tk, &tv)));
}
extern "C" __global__ void __launch_bounds__(128) k_ws_dq_bf16_128(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order, const __grid_constant__ TMap tk, const __grid_constant__ TMap tv) {
  WG_ONLY((wg_dq<128, false, true>(dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order, &tk, &tv)));
}
extern "C" __global__ void __launch_bounds__(128) k_ws_dq_f16_64(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order, const __grid_constant__ TMap tk, const __grid_constant__ TMap tv) {
  WG_ONLY((wg_dq<64, true, true>(dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order, &tk, &tv)));
}
extern "C" __global__ void __launch_bounds__(128) k_ws_dq_f16_128(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order, const __grid_constant__ TMap tk, const __grid_constant__ TMap tv) {
  WG_ONLY((wg_dq<128, true, true>(dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order, &tk, &tv)));
}

// The dk/dv pass with its Q and dout tiles loaded by the TMA (wg_dkv with
// TMA): the tensor maps of q and dout by value after k_wg_dkv_*'s
// arguments.
extern "C" __global__ void __launch_bounds__(384, 1) k_ws_dkv_bf16_64(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order, const __grid_constant__ TMap tq, const __grid_constant__ TMap tg) {
  WG_ONLY((wg_dkv<64, false, true>(dk, dv, dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order, &tq, &tg)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_ws_dkv_bf16_128(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order, const __grid_constant__ TMap tq, const __grid_constant__ TMap tg) {
  WG_ONLY((wg_dkv<128, false, true>(dk, dv, dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order, &tq, &tg)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_ws_dkv_f16_64(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order, const __grid_constant__ TMap tq, const __grid_constant__ TMap tg) {
  WG_ONLY((wg_dkv<64, true, true>(dk, dv, dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order, &tq, &tg)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_ws_dkv_f16_128(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* cu, int ns1, int t, int hq, int hkv, float scale, const int* order, const __grid_constant__ TMap tq, const __grid_constant__ TMap tg) {
  WG_ONLY((wg_dkv<128, true, true>(dk, dv, dq, dout, lse, q, k, v, cu, ns1, t, hq, hkv, scale, order, &tq, &tg)));
}

// The warp-specialised span forward (ws_fwd with SP): 384 threads per 128
// query rows and head, the tensor maps of q, k and v by value.
extern "C" __global__ void __launch_bounds__(384, 1) k_ws_spans_fwd_bf16_64(u16* out, float* lse, const __grid_constant__ TMap tq, const __grid_constant__ TMap tk, const __grid_constant__ TMap tv, const int* qk, int nq, int nk, int hq, int hkv, float scale, int pp) {
  WG_ONLY((ws_fwd<64, false, true, WS_BN, WS_STAGES>(out, lse, &tq, &tk, &tv, nullptr, 0, qk, nq, nk, hq, hkv, scale, nullptr, pp)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_ws_spans_fwd_bf16_128(u16* out, float* lse, const __grid_constant__ TMap tq, const __grid_constant__ TMap tk, const __grid_constant__ TMap tv, const int* qk, int nq, int nk, int hq, int hkv, float scale, int pp) {
  WG_ONLY((ws_fwd<128, false, true, WS_BN, WS_STAGES>(out, lse, &tq, &tk, &tv, nullptr, 0, qk, nq, nk, hq, hkv, scale, nullptr, pp)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_ws_spans_fwd_f16_64(u16* out, float* lse, const __grid_constant__ TMap tq, const __grid_constant__ TMap tk, const __grid_constant__ TMap tv, const int* qk, int nq, int nk, int hq, int hkv, float scale, int pp) {
  WG_ONLY((ws_fwd<64, true, true, WS_BN, WS_STAGES>(out, lse, &tq, &tk, &tv, nullptr, 0, qk, nq, nk, hq, hkv, scale, nullptr, pp)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_ws_spans_fwd_f16_128(u16* out, float* lse, const __grid_constant__ TMap tq, const __grid_constant__ TMap tk, const __grid_constant__ TMap tv, const int* qk, int nq, int nk, int hq, int hkv, float scale, int pp) {
  WG_ONLY((ws_fwd<128, true, true, WS_BN, WS_STAGES>(out, lse, &tq, &tk, &tv, nullptr, 0, qk, nq, nk, hq, hkv, scale, nullptr, pp)));
}

// The wgmma span forward (wg_fwd_spans): one CTA of 256 threads per 128
// query rows and head, Hopper only like the other k_wg_ kernels.
extern "C" __global__ void __launch_bounds__(256, 2) k_wg_spans_fwd_bf16_64(u16* out, float* lse, const u16* q, const u16* k, const u16* v, const int* qk, int tq, int tk, int hq, int hkv, float scale) {
  WG_ONLY((wg_fwd_spans<64, false>(out, lse, q, k, v, qk, tq, tk, hq, hkv, scale)));
}
extern "C" __global__ void __launch_bounds__(256, 2) k_wg_spans_fwd_bf16_128(u16* out, float* lse, const u16* q, const u16* k, const u16* v, const int* qk, int tq, int tk, int hq, int hkv, float scale) {
  WG_ONLY((wg_fwd_spans<128, false>(out, lse, q, k, v, qk, tq, tk, hq, hkv, scale)));
}
extern "C" __global__ void __launch_bounds__(256, 2) k_wg_spans_fwd_f16_64(u16* out, float* lse, const u16* q, const u16* k, const u16* v, const int* qk, int tq, int tk, int hq, int hkv, float scale) {
  WG_ONLY((wg_fwd_spans<64, true>(out, lse, q, k, v, qk, tq, tk, hq, hkv, scale)));
}
extern "C" __global__ void __launch_bounds__(256, 2) k_wg_spans_fwd_f16_128(u16* out, float* lse, const u16* q, const u16* k, const u16* v, const int* qk, int tq, int tk, int hq, int hkv, float scale) {
  WG_ONLY((wg_fwd_spans<128, true>(out, lse, q, k, v, qk, tq, tk, hq, hkv, scale)));
}

// The wgmma span backward: delta into dq's rows (k_wg_spans_pre_*, any
// GPU), then dk/dv (wg_dkv_spans) and dq (wg_dq_spans), which overwrites
// delta, as the causal backward does.
extern "C" __global__ void __launch_bounds__(128) k_wg_spans_pre_bf16_64(u16* dq, const u16* dout, const u16* out, int rows) {
  fa_bwd_pre<64, false, false>(dq, dout, out, rows, nullptr, 0, 1);
}
extern "C" __global__ void __launch_bounds__(128) k_wg_spans_dq_bf16_64(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* qk, int tq, int tk, int hq, int hkv, float scale) {
  WG_ONLY((wg_dq_spans<64, false>(dq, dout, lse, q, k, v, qk, tq, tk, hq, hkv, scale)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_wg_spans_dkv_bf16_64(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* kq, int tq, int tk, int hq, int hkv, float scale) {
  WG_ONLY((wg_dkv_spans<64, false>(dk, dv, dq, dout, lse, q, k, v, kq, tq, tk, hq, hkv, scale)));
}
extern "C" __global__ void __launch_bounds__(128) k_wg_spans_pre_f16_64(u16* dq, const u16* dout, const u16* out, int rows) {
  fa_bwd_pre<64, true, false>(dq, dout, out, rows, nullptr, 0, 1);
}
extern "C" __global__ void __launch_bounds__(128) k_wg_spans_dq_f16_64(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* qk, int tq, int tk, int hq, int hkv, float scale) {
  WG_ONLY((wg_dq_spans<64, true>(dq, dout, lse, q, k, v, qk, tq, tk, hq, hkv, scale)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_wg_spans_dkv_f16_64(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* kq, int tq, int tk, int hq, int hkv, float scale) {
  WG_ONLY((wg_dkv_spans<64, true>(dk, dv, dq, dout, lse, q, k, v, kq, tq, tk, hq, hkv, scale)));
}
extern "C" __global__ void __launch_bounds__(128) k_wg_spans_pre_bf16_128(u16* dq, const u16* dout, const u16* out, int rows) {
  fa_bwd_pre<128, false, false>(dq, dout, out, rows, nullptr, 0, 1);
}
extern "C" __global__ void __launch_bounds__(128) k_wg_spans_dq_bf16_128(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* qk, int tq, int tk, int hq, int hkv, float scale) {
  WG_ONLY((wg_dq_spans<128, false>(dq, dout, lse, q, k, v, qk, tq, tk, hq, hkv, scale)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_wg_spans_dkv_bf16_128(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* kq, int tq, int tk, int hq, int hkv, float scale) {
  WG_ONLY((wg_dkv_spans<128, false>(dk, dv, dq, dout, lse, q, k, v, kq, tq, tk, hq, hkv, scale)));
}
extern "C" __global__ void __launch_bounds__(128) k_wg_spans_pre_f16_128(u16* dq, const u16* dout, const u16* out, int rows) {
  fa_bwd_pre<128, true, false>(dq, dout, out, rows, nullptr, 0, 1);
}
extern "C" __global__ void __launch_bounds__(128) k_wg_spans_dq_f16_128(u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* qk, int tq, int tk, int hq, int hkv, float scale) {
  WG_ONLY((wg_dq_spans<128, true>(dq, dout, lse, q, k, v, qk, tq, tk, hq, hkv, scale)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_wg_spans_dkv_f16_128(u16* dk, u16* dv, const u16* dq, const u16* dout, const float* lse, const u16* q, const u16* k, const u16* v, const int* kq, int tq, int tk, int hq, int hkv, float scale) {
  WG_ONLY((wg_dkv_spans<128, true>(dk, dv, dq, dout, lse, q, k, v, kq, tq, tk, hq, hkv, scale)));
}
