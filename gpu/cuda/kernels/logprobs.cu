// Per-row softmax statistics of the logits workspace for LogProbs and its
// backward. One block per row.
//
// A logits row is V float32 values (151936 for Qwen-sized vocabularies, about
// 600 KB), and the rows that the resident blocks work on do not fit in L2
// together, so every pass over a row is a pass over HBM. The statistics are
// therefore computed online in a single pass: each thread keeps a running
// max and sums relative to it, rescaling them when the max grows, and the
// threads' states are then merged across the block in a fixed order.
//
// Each value's weight exp(z − m) is computed in float32 (expf, within 2 ulp)
// and summed in float64; the rescaling, the merges and the final logarithms
// are float64. The CPU reference computes the weights in float64, so
// the two agree to about 1e-7 relative, not bit for bit. Float64 exponentials
// for each of a row's 151936 values made these kernels bound by the GPU's
// float64 units instead of by memory.

struct RowStats {
  double lseZ, lseU, meanU;
};

// Online is a running softmax state over values x: m = max x, s = Σ exp(x−m)
// and t = Σ exp(x−m)·x. The empty state is m = -inf, s = t = 0. A value of
// -inf contributes nothing to s or t (its weight is exactly zero), and m
// stays -inf only while every value seen is -inf or NaN, so exp is never
// asked for exp(-inf - -inf). A NaN value never raises m but makes s and t
// NaN, as it makes the two-pass sums NaN.
struct Online {
  double m, s, t;
};

__device__ __forceinline__ Online on_empty() {
  Online a;
  a.m = -D_INF;
  a.s = 0.0;
  a.t = 0.0;
  return a;
}

// on_raise raises a's max to mx when mx is larger, rescaling s and t by
// exp(m_old − mx). When m_old is -inf, s and t are zero (or NaN) and the
// factor exp(-inf) is exactly zero, so no guard is needed here.
template <bool T>
__device__ __forceinline__ void on_raise(Online& a, double mx) {
  if (mx > a.m) {
    double c = exp(a.m - mx);
    a.s *= c;
    if (T) a.t *= c;
    a.m = mx;
  }
}

// on_add adds z, which must not exceed m = a.m unless it is NaN, to a's
// sums: its weight exp(z − m) in float32, widened. m is a.m as a float32,
// which is exact: a.m is only ever raised to a float32 value. When T is
// false the sum t is not kept.
template <bool T>
__device__ __forceinline__ void on_add(Online& a, float z, float m) {
  if (z != -F_INF) {
    double e = (double)expf(z - m);
    a.s += e;
    if (T) a.t += e * (double)z;
  }
}

// on_merge returns the state of the union of the values of a and b. The
// kernels are compiled with --fmad=false, so the result does not depend on
// the order of a and b.
template <bool T>
__device__ __forceinline__ Online on_merge(Online a, Online b) {
  Online r;
  r.m = fmax(a.m, b.m);
  if (r.m == -D_INF) {
    r.s = a.s + b.s;
    r.t = T ? a.t + b.t : 0.0;
    return r;
  }
  double ca = exp(a.m - r.m), cb = exp(b.m - r.m);
  r.s = a.s * ca + b.s * cb;
  r.t = T ? a.t * ca + b.t * cb : 0.0;
  return r;
}

// warp_merge merges the states of the 32 lanes of a warp by xor shuffles
// and returns the result to every lane.
template <bool T>
__device__ __forceinline__ Online warp_merge(Online a) {
  for (int o = 16; o > 0; o >>= 1) {
    Online b;
    b.m = __shfl_xor_sync(0xffffffffu, a.m, o);
    b.s = __shfl_xor_sync(0xffffffffu, a.s, o);
    b.t = T ? __shfl_xor_sync(0xffffffffu, a.t, o) : 0.0;
    a = on_merge<T>(a, b);
  }
  return a;
}

// block_merge merges the threads' states a (of z) and, for LP_ENT_U, b (of
// u) over the block and returns the result to every thread, in a fixed order
// like block_sum_d: lanes within each warp, then the warps' results within
// warp 0. sh must hold 6*33 doubles; blockDim.x must be a multiple of 32.
template <int MODE>
__device__ void block_merge(Online& a, Online& b, double* sh) {
  const bool ta = MODE == LP_ENT_Z, two = MODE == LP_ENT_U;
  int w = threadIdx.x >> 5, ln = threadIdx.x & 31, nw = blockDim.x >> 5;
  a = warp_merge<ta>(a);
  if (two) b = warp_merge<true>(b);
  // The barrier lets every thread finish reading sh from the previous row
  // before it is overwritten.
  __syncthreads();
  if (ln == 0) {
    double* p = sh + 6 * w;
    p[0] = a.m, p[1] = a.s, p[2] = a.t;
    if (two) p[3] = b.m, p[4] = b.s, p[5] = b.t;
  }
  __syncthreads();
  if (w == 0) {
    Online x = on_empty(), y = on_empty();
    if (ln < nw) {
      const double* p = sh + 6 * ln;
      x.m = p[0], x.s = p[1], x.t = p[2];
      if (two) y.m = p[3], y.s = p[4], y.t = p[5];
    }
    x = warp_merge<ta>(x);
    if (two) y = warp_merge<true>(y);
    if (ln == 0) {
      double* p = sh + 6 * 32;
      p[0] = x.m, p[1] = x.s, p[2] = x.t;
      if (two) p[3] = y.m, p[4] = y.s, p[5] = y.t;
    }
  }
  __syncthreads();
  const double* p = sh + 6 * 32;
  a.m = p[0], a.s = p[1], a.t = p[2];
  if (two) b.m = p[3], b.s = p[4], b.t = p[5];
}

// lp_step adds n (1 or 4) consecutive logits x to a thread's states: z =
// x/temp, computed in float32 and then widened as in the CPU reference, to
// a, and for LP_ENT_U the raw logit to b. The max is raised once for the n
// values, so that a row costs one exp per value and state. The maxima are
// taken in float32, which gives the same value as in float64 because
// widening is exact and monotonic, and the values are kept as float32 until
// they are used, which saves registers.
template <int MODE, int N>
__device__ __forceinline__ void lp_step(Online& a, Online& b, const float* x, float temp) {
  const bool ta = MODE == LP_ENT_Z;
  float z[N];
  float mz = -F_INF;
#pragma unroll
  for (int k = 0; k < N; k++) {
    z[k] = temp == 1.0f ? x[k] : x[k] / temp;
    mz = fmaxf(mz, z[k]);
  }
  on_raise<ta>(a, (double)mz);
  float am = (float)a.m;
#pragma unroll
  for (int k = 0; k < N; k++) on_add<ta>(a, z[k], am);
  if (MODE == LP_ENT_U) {
    float mu = -F_INF;
#pragma unroll
    for (int k = 0; k < N; k++) mu = fmaxf(mu, x[k]);
    on_raise<true>(b, (double)mu);
    float bm = (float)b.m;
#pragma unroll
    for (int k = 0; k < N; k++) on_add<true>(b, x[k], bm);
  }
}

// row_stats_m reads row l once. The row starts at an arbitrary multiple of
// 4 bytes (rows are v floats apart and v may be odd), so the values before
// the first 16-byte boundary (the head, at most 3) and after the last whole
// float4 (the tail, at most 3) are read as scalars and the rest as float4,
// with consecutive threads on consecutive float4s. Each value is read by a
// thread fixed by v and the row's alignment, so the result does not depend
// on timing.
template <int MODE>
__device__ RowStats row_stats_m(const float* l, i64 v, float temp, double* sh) {
  Online a = on_empty(), b = on_empty();
  unsigned long long addr = (unsigned long long)l;
  i64 head = v;
  if ((addr & 3) == 0) {
    head = (i64)(((16 - (addr & 15)) & 15) >> 2);
    if (head > v) head = v;
  }
  i64 n4 = (v - head) >> 2;
  for (i64 j = threadIdx.x; j < head; j += blockDim.x) lp_step<MODE, 1>(a, b, l + j, temp);
  const float4* l4 = (const float4*)(l + head);
  // Four loads are issued before any is used, to keep more bytes in
  // flight; each thread still takes its float4s in the same order.
  i64 i = threadIdx.x, B = blockDim.x;
  for (; i + 3 * B < n4; i += 4 * B) {
    float4 q[4] = {l4[i], l4[i + B], l4[i + 2 * B], l4[i + 3 * B]};
#pragma unroll
    for (int u = 0; u < 4; u++) {
      float x[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
      lp_step<MODE, 4>(a, b, x, temp);
    }
  }
  for (; i < n4; i += B) {
    float4 q = l4[i];
    float x[4] = {q.x, q.y, q.z, q.w};
    lp_step<MODE, 4>(a, b, x, temp);
  }
  for (i64 j = head + 4 * n4 + threadIdx.x; j < v; j += blockDim.x) lp_step<MODE, 1>(a, b, l + j, temp);
  block_merge<MODE>(a, b, sh);
  // With every logit -inf (or v == 0), s is 0 and lseZ is -inf.
  RowStats st;
  st.lseZ = a.m + log(a.s);
  st.lseU = st.lseZ;
  st.meanU = 0.0;
  if (MODE == LP_ENT_Z) st.meanU = a.t / a.s;
  if (MODE == LP_ENT_U) {
    st.lseU = b.m + log(b.s);
    st.meanU = b.t / b.s;
  }
  return st;
}

// stats_mode is the kind of statistics row_stats computes: LP_LSE without
// an entropy, else LP_ENT_Z (the entropy's logits are z: tempered, or a
// temperature of 1) or LP_ENT_U.
__device__ __forceinline__ int stats_mode(float temp, int tempered, bool ent) {
  if (!ent) return LP_LSE;
  return tempered || temp == 1.0f ? LP_ENT_Z : LP_ENT_U;
}

// row_stats computes, for the tempered logits z = l/temp, their log-sum-exp
// and, when ent is set, the log-sum-exp and mean of the entropy's logits u
// (z when tempered or temp == 1, else the raw logits), reading the row once.
// sh must hold 6*33 doubles. All threads of the block must call it with the
// same arguments. Its choice of mode is stats_mode's (written out here:
// through stats_mode ptxas gave k_lp_fwd 66 registers instead of 62,
// which would leave one of its blocks an SM instead of two).
__device__ RowStats row_stats(const float* l, i64 v, float temp, int tempered, bool ent, double* sh) {
  if (!ent) return row_stats_m<LP_LSE>(l, v, temp, sh);
  if (tempered || temp == 1.0f) return row_stats_m<LP_ENT_Z>(l, v, temp, sh);
  return row_stats_m<LP_ENT_U>(l, v, temp, sh);
}

// k_lp_fwd writes logp[r] and, when ent is not null, entropy[r]. A target
// outside [0,v) writes NaN and raises FLAG_TARGETS. Where stats is not
// null, row r's statistics go to stats[4r..4r+3]: lseZ, lseU, meanU and
// their tag (stats_tag), for k_lp_bwd and k_lp_bwd8. The launch bound
// keeps two blocks an SM, as k_lp_bwd8's does (64 registers).
extern "C" __global__ void __launch_bounds__(512, 2) k_lp_fwd(const float* logits, i64 c, i64 v, const int* targets, float temp, int tempered,
                                    float* logp, float* ent, double* stats, int* flag) {
  __shared__ double sh[6 * 33];
  for (i64 r = blockIdx.x; r < c; r += gridDim.x) {
    const float* l = logits + r * v;
    RowStats st = row_stats(l, v, temp, tempered, ent != 0, sh);
    if (stats && threadIdx.x == 0) {
      double* s = stats + 4 * r;
      s[0] = st.lseZ, s[1] = st.lseU, s[2] = st.meanU;
      s[3] = stats_tag(temp, stats_mode(temp, tempered, ent != 0));
    }
    if (threadIdx.x == 0) {
      int y = targets[r];
      if (y < 0 || y >= v) {
        atomicOr(flag, FLAG_TARGETS);
        logp[r] = __int_as_float(0x7fc00000);
      } else {
        logp[r] = (float)((double)(l[y] / temp) - st.lseZ);
      }
      if (ent) ent[r] = (float)(st.lseU - st.meanU);
    }
    __syncthreads();
  }
}

// BwdRow holds what the backward needs of a row, besides its values: the
// statistics, the gradient factors gl = dlogp/temp and gh = dentropy·tau,
// and the target.
struct BwdRow {
  RowStats st;
  float gl, gh;
  int y;
  bool ent, tempered;
};

// bwd_row computes the statistics and factors of row l; every thread of the
// block must call it. Where stats is not null and row r's saved
// statistics (k_lp_fwd's) were computed for this temperature with what
// this row needs (an entropy's too when dent[r] is not 0: the log-sum-exp
// of z comes out the same in every mode), it takes them instead of
// reading the row: the same bits, as both kernels run in blocks of
// lpBlock threads (logprobs.go) and row_stats' sums follow the block.
__device__ BwdRow bwd_row(const float* l, i64 r, i64 v, const int* targets, float temp, int tempered,
                          const float* dlogp, const float* dent, const double* stats, int* flag, double* sh) {
  BwdRow b;
  b.ent = dent != 0 && dent[r] != 0.0f;
  b.tempered = tempered != 0;
  const double* s = stats ? stats + 4 * r : 0;
  int mode = stats_mode(temp, tempered, b.ent);
  // A row without an entropy gradient needs only lseZ, which a forward
  // with an entropy saved too.
  bool saved = s && (s[3] == stats_tag(temp, mode) ||
                     (mode == LP_LSE && s[3] == stats_tag(temp, stats_mode(temp, tempered, true))));
  if (saved) {
    b.st.lseZ = s[0], b.st.lseU = s[1], b.st.meanU = s[2];
  } else {
    b.st = row_stats(l, v, temp, tempered, b.ent, sh);
  }
  double tau = tempered ? 1.0 / (double)temp : 1.0;
  b.gl = (float)((double)dlogp[r] / (double)temp);
  b.gh = b.ent ? (float)((double)dent[r] * tau) : 0.0f;
  b.y = targets[r];
  if ((b.y < 0 || b.y >= v) && threadIdx.x == 0) atomicOr(flag, FLAG_TARGETS);
  return b;
}

// dlogit returns d(loss)/d(logit) for value x at column j of a row:
// −gl·p + gl·[j = y] − gh·q·(u − meanU), with p = softmax(z) and q the
// entropy's softmax of u. The differences from the float64 statistics are
// taken in float64 and the exponentials in float32: the result is rounded
// to the workspace's dtype (float32, or bf16/f16 for the tensor-core
// products), so float64 exponentials would buy nothing.
__device__ __forceinline__ float dlogit(float x, i64 j, const BwdRow& b, float temp) {
  float z = temp == 1.0f ? x : x / temp;
  float p = expf((float)((double)z - b.st.lseZ));
  float d = -b.gl * p;
  if (j == b.y) d += b.gl;
  if (b.ent) {
    float u = b.tempered ? z : x;
    float q = expf((float)((double)u - b.st.lseU));
    float c = (float)((double)u - b.st.meanU);
    d -= b.gh * q * c;
  }
  return d;
}

// k_lp_bwd turns the logits row into dlogits in place. With outdt F32 the
// row stays float32; with BF16 or F16 the row is rewritten as 16-bit values
// packed at the start of its own float32 row (so the result is a [c,v]
// matrix with a leading dimension of 2v elements), chunk by chunk with a
// barrier between each chunk's reads and writes: chunk k writes only bytes
// that chunks 0..k have already read. The launch bound admits any block size
// and caps the registers at 64, so that two of the 512-thread blocks that
// logprobs.go launches fit on an SM; without it ptxas gives the kernel 66
// registers for sm_90 and one block per SM (with it, it spills one 8-byte
// value).
extern "C" __global__ void __launch_bounds__(1024)
    k_lp_bwd(float* logits, i64 c, i64 v, const int* targets, float temp, int tempered, const float* dlogp,
             const float* dent, int outdt, const double* stats, int* flag) {
  __shared__ double sh[6 * 33];
  for (i64 r = blockIdx.x; r < c; r += gridDim.x) {
    float* l = logits + r * v;
    BwdRow br = bwd_row(l, r, v, targets, temp, tempered, dlogp, dent, stats, flag, sh);
    u16* o16 = (u16*)l;
    for (i64 base = 0; base < v; base += blockDim.x) {
      i64 j = base + threadIdx.x;
      float dv = 0.0f;
      if (j < v) dv = dlogit(l[j], j, br, temp);
      if (outdt == DT_F32) {
        if (j < v) l[j] = dv;
      } else {
        __syncthreads();
        if (j < v) o16[j] = outdt == DT_BF16 ? f2bf(dv) : f2h(dv);
      }
    }
    __syncthreads();
  }
}

// k_lp_bwd8 is k_lp_bwd for rows of a multiple of 8 values starting at
// 16-byte boundaries (v % 8 == 0 and an aligned workspace; logprobs.go
// checks), with 16-byte loads and stores and one barrier per chunk of
// 8·blockDim.x values instead of one per blockDim.x. Group g is the 8 values
// [8g, 8g+8); chunk k holds the groups [Bk, B(k+1)) for B = blockDim.x,
// thread t taking group Bk+t. A 16-bit group g is written to bytes [16g,
// 16g+16) of the row, the float32 values [4g, 4g+4), so chunk k writes only
// values of chunks 0..k: the barrier between its reads and its writes is
// the only one it needs. Each thread loads its group of chunk k+1 before
// that barrier (chunk k's writes end before chunk k+1's values begin), so
// the loads are in flight while the block waits and stores. The values are
// the same as k_lp_bwd's, element for element.
extern "C" __global__ void __launch_bounds__(512, 2)
    k_lp_bwd8(float* logits, i64 c, i64 v, const int* targets, float temp, int tempered, const float* dlogp,
              const float* dent, int outdt, const double* stats, int* flag) {
  __shared__ double sh[6 * 33];
  i64 ng = v / 8, B = blockDim.x;
  for (i64 r = blockIdx.x; r < c; r += gridDim.x) {
    float* l = logits + r * v;
    BwdRow br = bwd_row(l, r, v, targets, temp, tempered, dlogp, dent, stats, flag, sh);
    i64 g = threadIdx.x;
    float x[8], nx[8];
    if (g < ng) ld8(l, DT_F32, g * 8, x);
    for (i64 g0 = 0; g0 < ng; g0 += B, g += B) {
      if (g < ng) {
#pragma unroll
        for (int e = 0; e < 8; e++) x[e] = dlogit(x[e], g * 8 + e, br, temp);
      }
      if (g + B < ng) ld8(l, DT_F32, (g + B) * 8, nx);
      if (outdt != DT_F32) __syncthreads();
      if (g < ng) st8(l, outdt, g * 8, x);
#pragma unroll
      for (int e = 0; e < 8; e++) x[e] = nx[e];
    }
    __syncthreads();
  }
}
