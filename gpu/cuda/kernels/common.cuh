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

#define F_INF __int_as_float(0x7f800000)
#define D_INF __longlong_as_double(0x7ff0000000000000LL)

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((u32)h) << 16); }
__device__ __forceinline__ u16 f2bf(float f) {
  u32 b = __float_as_uint(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (u16)((b >> 16) | 0x40u);
  b += 0x7fffu + ((b >> 16) & 1u);
  return (u16)(b >> 16);
}
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
// rnd rounds v to the precision of dt.
__device__ __forceinline__ float rnd(int dt, float v) {
  if (dt == DT_BF16) return bf2f(f2bf(v));
  if (dt == DT_F16) return h2f(f2h(v));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
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
