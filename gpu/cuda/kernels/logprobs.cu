// Per-row softmax statistics of the logits workspace for LogProbs and its
// backward, in float64 like the CPU reference. One block per row.

struct RowStats {
  double lseZ, lseU, meanU;
};

// row_stats computes, for the tempered logits z = l/temp, their log-sum-exp
// and, when ent is set, the log-sum-exp and mean of the entropy's logits u
// (z when tempered or temp == 1, else the raw logits).
__device__ RowStats row_stats(const float* l, i64 v, float temp, int tempered, bool ent, double* sh) {
  RowStats st;
  double mz = -D_INF;
  for (i64 j = threadIdx.x; j < v; j += blockDim.x) mz = fmax(mz, (double)(l[j] / temp));
  mz = block_max_d(mz, sh);
  double s = 0.0;
  for (i64 j = threadIdx.x; j < v; j += blockDim.x) s += exp((double)(l[j] / temp) - mz);
  s = block_sum_d(s, sh);
  st.lseZ = mz + log(s);
  st.lseU = st.lseZ;
  st.meanU = 0.0;
  if (!ent) return st;
  if (tempered || temp == 1.0f) {
    double e = 0.0;
    for (i64 j = threadIdx.x; j < v; j += blockDim.x) {
      double z = (double)(l[j] / temp);
      e += exp(z - st.lseZ) * z;
    }
    st.meanU = block_sum_d(e, sh);
    return st;
  }
  double mu = -D_INF;
  for (i64 j = threadIdx.x; j < v; j += blockDim.x) mu = fmax(mu, (double)l[j]);
  mu = block_max_d(mu, sh);
  double s2 = 0.0, e2 = 0.0;
  for (i64 j = threadIdx.x; j < v; j += blockDim.x) {
    double x = (double)l[j];
    double p = exp(x - mu);
    s2 += p;
    e2 += p * x;
  }
  s2 = block_sum_d(s2, sh);
  e2 = block_sum_d(e2, sh);
  st.lseU = mu + log(s2);
  st.meanU = e2 / s2;
  return st;
}

// k_lp_fwd writes logp[r] and, when ent is not null, entropy[r]. A target
// outside [0,v) writes NaN and raises FLAG_TARGETS.
extern "C" __global__ void k_lp_fwd(const float* logits, i64 c, i64 v, const int* targets, float temp, int tempered,
                                    float* logp, float* ent, int* flag) {
  __shared__ double sh[33];
  for (i64 r = blockIdx.x; r < c; r += gridDim.x) {
    const float* l = logits + r * v;
    RowStats st = row_stats(l, v, temp, tempered, ent != 0, sh);
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

// k_lp_bwd turns the logits row into dlogits in place. With outdt F32 the
// row stays float32; with BF16 or F16 the row is rewritten as 16-bit values
// packed at the start of its own float32 row (so the result is a [c,v]
// matrix with a leading dimension of 2v elements), chunk by chunk with a
// barrier between each chunk's reads and writes: chunk k writes only bytes
// that chunks 0..k have already read.
extern "C" __global__ void k_lp_bwd(float* logits, i64 c, i64 v, const int* targets, float temp, int tempered,
                                    const float* dlogp, const float* dent, int outdt, int* flag) {
  __shared__ double sh[33];
  for (i64 r = blockIdx.x; r < c; r += gridDim.x) {
    float* l = logits + r * v;
    bool withEnt = dent != 0 && dent[r] != 0.0f;
    RowStats st = row_stats(l, v, temp, tempered, withEnt, sh);
    double gl = (double)dlogp[r] / (double)temp;
    double tau = tempered ? 1.0 / (double)temp : 1.0;
    double gh = withEnt ? (double)dent[r] * tau : 0.0;
    int y = targets[r];
    if ((y < 0 || y >= v) && threadIdx.x == 0) atomicOr(flag, FLAG_TARGETS);
    u16* o16 = (u16*)l;
    for (i64 base = 0; base < v; base += blockDim.x) {
      i64 j = base + threadIdx.x;
      float dv = 0.0f;
      if (j < v) {
        float x = l[j];
        double p = exp((double)(x / temp) - st.lseZ);
        double d = -gl * p;
        if (j == y) d += gl;
        if (withEnt) {
          double u = tempered ? (double)(x / temp) : (double)x;
          d -= gh * exp(u - st.lseU) * (u - st.meanU);
        }
        dv = (float)d;
      }
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
