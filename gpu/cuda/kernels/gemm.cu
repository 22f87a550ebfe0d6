// k_gemm is the SIMT fallback for matrix products whose operand dtypes
// cuBLASLt cannot combine (e.g. an f32 operand with a bf16 one): C[m,n] =
// alpha*op(A)@op(B) + beta*C with float32 accumulation, all row-major with
// leading dimensions in elements. 64x64 tiles, 256 threads, 4x4 per thread.

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
