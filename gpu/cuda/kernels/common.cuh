// common.cuh is prepended to every kernel file before NVRTC compiles it. It
// defines the dtype codes (equal to gpu.DType values), exact conversions that
// match package gpu bit for bit (round to nearest even), and block
// reductions with a fixed order, so that results do not depend on timing.
typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;

#define DT_F32 1
#define DT_BF16 2
#define DT_F16 3
#define DT_I32 4

// Bits of the device error flag (see errflag.go).
#define FLAG_EMBEDDING_IDS 1
#define FLAG_EMBEDDING_BWD_IDS 2
#define FLAG_TARGETS 4
#define FLAG_CUSEQLENS 8
#define FLAG_COPY_ROWS 16

#define F_INF __int_as_float(0x7f800000)
#define D_INF __longlong_as_double(0x7ff0000000000000LL)

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((u32)h) << 16); }
// f2bf rounds f to bfloat16, to nearest even; a NaN keeps its sign and top
// payload bits, quietened, as gpu.F32ToBF16 does. From sm_80 on, the
// rounding is the hardware's cvt.rn (one instruction, where the integer
// sequence below took six and left the row kernels instruction-bound) and
// only a NaN takes the integer path.
__device__ __forceinline__ u16 f2bf_nan(float f) { return (u16)((__float_as_uint(f) >> 16) | 0x40u); }
__device__ __forceinline__ u16 f2bf(float f) {
#if __CUDA_ARCH__ >= 800
  u16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return f != f ? f2bf_nan(f) : h;
#else
  u32 b = __float_as_uint(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return f2bf_nan(f);
  b += 0x7fffu + ((b >> 16) & 1u);
  return (u16)(b >> 16);
#endif
}
// f2bf2 packs lo and hi rounded to bfloat16 (f2bf) into one word, lo in
// the low half: one cvt.rn.bf16x2 from sm_80 on.
__device__ __forceinline__ u32 f2bf2(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
  u32 w;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
  if (lo != lo || hi != hi) w = (u32)f2bf(lo) | ((u32)f2bf(hi) << 16);
  return w;
#else
  return (u32)f2bf(lo) | ((u32)f2bf(hi) << 16);
#endif
}
// bf16x2_rn packs lo and hi rounded to bfloat16, lo in the low half, in
// one cvt.rn.bf16x2 (sm_80 on): f2bf2's bits for a pair without a NaN; a
// NaN comes out as the canonical 0x7fff, where f2bf2 keeps its payload
// (bf16x2_nan finds it, for the callers that then take f2bf2).
__device__ __forceinline__ u32 bf16x2_rn(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
  u32 w;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
  return w;
#else
  return f2bf2(lo, hi);
#endif
}
// bf16x2_nan is not 0 when a half of w is a NaN: its low 15 bits above
// 0x7f80 carry into its top bit once 0x7f is added.
__device__ __forceinline__ u32 bf16x2_nan(u32 w) { return ((w & 0x7fff7fffu) + 0x007f007fu) & 0x80008000u; }
__device__ __forceinline__ float h2f(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ u16 f2h(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
// f2i rounds half away from zero and saturates like gpu.F32ToI32.
__device__ __forceinline__ int f2i(float v) {
  if (v != v) return 0;
  if (v >= 2147483647.0f) return 2147483647;
  if (v <= -2147483648.0f) return (int)0x80000000;
  return (int)round((double)v);
}
__device__ __forceinline__ float ldf(const void* p, int dt, i64 i) {
  if (dt == DT_F32) return ((const float*)p)[i];
  if (dt == DT_BF16) return bf2f(((const u16*)p)[i]);
  if (dt == DT_F16) return h2f(((const u16*)p)[i]);
  return (float)((const int*)p)[i];
}
__device__ __forceinline__ void stf(void* p, int dt, i64 i, float v) {
  if (dt == DT_F32) ((float*)p)[i] = v;
  else if (dt == DT_BF16) ((u16*)p)[i] = f2bf(v);
  else if (dt == DT_F16) ((u16*)p)[i] = f2h(v);
  else ((int*)p)[i] = f2i(v);
}
// bf16_rn rounds v to bfloat16 as f2bf does for every v but a NaN, which
// comes out as some NaN: for rnd, whose NaN results only ever meet
// arithmetic (the GPU's gives canonical NaNs anyway) or a store through
// f2bf.
__device__ __forceinline__ float bf16_rn(float v) {
#if __CUDA_ARCH__ >= 800
  u16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
  return bf2f(h);
#else
  return bf2f(f2bf(v));
#endif
}
// rnd rounds v to the precision of dt.
__device__ __forceinline__ float rnd(int dt, float v) {
  if (dt == DT_BF16) return bf16_rn(v);
  if (dt == DT_F16) return h2f(f2h(v));
  return v;
}

// InvFreq carries the rotary inverse frequencies by value in the kernel
// parameters (head dims up to 512).
struct InvFreq {
  float v[256];
};

// rope_cs sets c and s to the cos and sin of position p's angle for inverse
// frequency f: computed in float64 from the float32 angle and rounded to
// dt, as HF does; s is negated for the backward (the rotation by the
// negative angle).
__device__ __forceinline__ void rope_cs(float p, float f, int dt, int backward, float* c, float* s) {
  double a = (double)(p * f);
  *c = rnd(dt, (float)cos(a));
  float sv = rnd(dt, (float)sin(a));
  *s = backward ? -sv : sv;
}

// rope_pair rotates the pair (x1, x2) = (x[i], x[i+d/2]) by (c, s) with HF
// apply_rotary_pos_emb's roundings to dt.
__device__ __forceinline__ void rope_pair(int dt, float x1, float x2, float c, float s, float* y1, float* y2) {
  *y1 = rnd(dt, rnd(dt, x1 * c) + rnd(dt, -x2 * s));
  *y2 = rnd(dt, rnd(dt, x2 * c) + rnd(dt, x1 * s));
}

// The three kinds of a log-prob row's statistics (logprobs.cu, lphead.cu):
// the log-sum-exp of z = l/temp only (LP_LSE); also the mean of z under
// softmax(z), for an entropy of the tempered logits (LP_ENT_Z); or also the
// log-sum-exp and mean of the raw logits u = l, for an untempered entropy
// with temp != 1 (LP_ENT_U).
#define LP_LSE 0
#define LP_ENT_Z 1
#define LP_ENT_U 2

// stats_tag is what a row's saved statistics were computed for: the
// temperature's bits and the mode, exactly representable as a float64.
__device__ __forceinline__ double stats_tag(float temp, int mode) {
  return (double)__float_as_uint(temp) * 4.0 + (double)mode;
}

// LOG2E is log2(e) in float32.
#define LOG2E 1.4426950408889634f

// exp2_approx is 2^x on the special function unit (ex2.approx.ftz: flushes
// subnormals; −Inf gives 0), the softmaxes' exponential (attention's
// forward and backward, the fused log-prob head).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// sigmoid is computed in float32 with the hardware's approximate
// exponential and reciprocal (a few float32 ulps, more for |x| in the
// tens), where the CPU reference takes float64 and rounds once: both far
// below a bf16 activation's rounding. expf and an IEEE division were about
// half the instructions of the fused gate/up product's epilogue (gemm.cu),
// where the tensor cores wait for it; without them the kernel took 644
// instead of 715 us (docs/performance.md). The reciprocal gives 0 for a
// denominator past 2^126, that is sigmoid(x) = 0 for x below about -87
// (the true value is below 1e-38). A float64 exponential per element held
// the SwiGLU kernels (elementwise.cu) below the memory's speed.
//
// It is __fdividef(1, 1 + __expf(-x)) with subnormals flushed (ex2 and div
// .approx.ftz), bit for bit for every float32 x: the exponential's
// argument -x·log2(e) is the same product; only a result below 2^-126
// differs, and 1 + it rounds to 1 either way; the denominator is 1 or
// more (or a NaN), never subnormal, and its reciprocal past 2^126 is 0
// either way (a check over all 2^32 inputs found no pattern that differs:
// bench/results/2026-11-28-prefetch/, call 3). Without the flush, each of
// the two took a range test and a rescaling around it: 11 instructions a
// sigmoid instead of 4 in the SASS of k_gemm_dswiglu_bf16 (same place).
__device__ __forceinline__ float sigmoid(float x) {
  float e, s;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(__fmul_rn(x, -1.44269502162933349609375f)));
  asm("div.approx.ftz.f32 %0, %1, %2;" : "=f"(s) : "f"(1.0f), "f"(__fadd_rn(1.0f, e)));
  return s;
}

// SwiGLU and its backward, one element, in the roundings of the gate's
// dtype dt: the unfused kernels (elementwise.cu) and the fused products'
// epilogues (gemm.cu) take these, so that their bits agree.
//
// swiglu1 is silu(x) rounded to dt, times y (the caller rounds the
// result).
__device__ __forceinline__ float swiglu1(int dt, float x, float y) { return rnd(dt, x * sigmoid(x)) * y; }
// dswiglu_tail finishes the backward at gate x, s = sigmoid(x), for the
// output's gradient d, from its two rounded values a = rnd(x·s) and
// b = rnd(d·y): du = d·a and dg = b·s·(1 + x·(1 − s)).
__device__ __forceinline__ void dswiglu_tail(float d, float x, float s, float a, float b, float& dg, float& du) {
  du = d * a;
  dg = b * (s * (1.0f + x * (1.0f - s)));
}
// dswiglu1 is the backward at gate x and up y for the gradient d.
__device__ __forceinline__ void dswiglu1(int dt, float d, float x, float y, float& dg, float& du) {
  float s = sigmoid(x);
  dswiglu_tail(d, x, s, rnd(dt, x * s), rnd(dt, d * y), dg, du);
}

// ld8 loads the 8 elements p[i..i+8) as floats: one 16-byte load for a
// 16-bit dtype, two for float32. i must be a multiple of 8 and p 16-byte
// aligned; dt is a float dtype (the Go side checks both).
__device__ __forceinline__ void ld8(const void* p, int dt, i64 i, float* v) {
  if (dt == DT_F32) {
    const float4* q = (const float4*)p + i / 4;
    float4 a = q[0], b = q[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
  uint4 u = ((const uint4*)p)[i / 8];
  u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; k++) {
    u16 lo = (u16)(w[k] & 0xffffu), hi = (u16)(w[k] >> 16);
    v[2 * k] = dt == DT_BF16 ? bf2f(lo) : h2f(lo);
    v[2 * k + 1] = dt == DT_BF16 ? bf2f(hi) : h2f(hi);
  }
}
// st8 stores 8 floats rounded to dt at p[i..i+8), with the alignment rules
// of ld8.
__device__ __forceinline__ void st8(void* p, int dt, i64 i, const float* v) {
  if (dt == DT_F32) {
    float4* q = (float4*)p + i / 4;
    q[0] = make_float4(v[0], v[1], v[2], v[3]);
    q[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
  u32 w[4];
#pragma unroll
  for (int k = 0; k < 4; k++)
    w[k] = dt == DT_BF16 ? f2bf2(v[2 * k], v[2 * k + 1]) : (u32)f2h(v[2 * k]) | ((u32)f2h(v[2 * k + 1]) << 16);
  ((uint4*)p)[i / 8] = make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// quad_max and quad_sum reduce over the 4 threads of a quad (lanes 4i to
// 4i+3), which hold one row of an mma fragment between them.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_max_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// block_sum_d returns the sum of v over the block to every thread. sh must
// hold 33 doubles; blockDim.x must be a multiple of 32.
__device__ double block_sum_d(double v, double* sh) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  v = warp_sum_d(v);
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    double x = l < nw ? sh[l] : 0.0;
    x = warp_sum_d(x);
    if (l == 0) sh[32] = x;
  }
  __syncthreads();
  return sh[32];
}
__device__ double block_max_d(double v, double* sh) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  v = warp_max_d(v);
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    double x = l < nw ? sh[l] : -D_INF;
    x = warp_max_d(x);
    if (l == 0) sh[32] = x;
  }
  __syncthreads();
  return sh[32];
}

#define GRID_STRIDE(i, n) \
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// GRID_STRIDE8 walks the 8-element groups of n elements (n a multiple of 8):
// i is the index of each group's first element.
#define GRID_STRIDE8(i, n)                                                                          \
  for (i64 i = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < (n); i += (i64)gridDim.x * blockDim.x * 8)
