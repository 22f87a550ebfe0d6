// The attention's q, k and v projections on Hopper with their biases and
// RoPE in the epilogue: k_gemm_qkv_* multiplies x [m, k] by the fused
// weight w [(hq+2·hkv)·d, k] (16-bit, row-major, k a multiple of 64) and
// writes q [m, hq, d], k [m, hkv, d] and v [m, hkv, d] themselves, with the
// values of the product rounded to the dtype and then QKVSplit (the bias
// added and rounded, q and k rotated with rope_pair's roundings, cos and
// sin from rope_cs), up to the product's accumulation order. k_rope_cs16
// first writes each token's cos and sin (rope_cs, exact in the dtype) to a
// table the epilogue reads: computed there, in float64 for every tile, they
// held the epilogue's three warps to 2.3 times the product's time. The
// epilogue adds, multiplies and rotates pairs of 16-bit values packed in
// 32-bit words (qp_fma). The product's
// [m, (hq+2·hkv)·d] output never reaches memory: at Qwen2.5-3B's 16,384
// tokens that is 84 MB written and read back a layer.
//
// k_gemm_swiglu_*'s product (kernels/gemm.cu, and the ring of hopper.cuh)
// on tiles of 128 rows and 256 columns (m64n256k16: whole heads of 64 or
// 128, so that a column and the one half a head after it, RoPE's pair, are
// in the same tile): persistent CTAs take the tiles in grouped order from
// hopper.cuh's tile queue;
// thread 0 copies x's and w's tiles through the TMA into a ring of QP_ST
// buffers; two consumer warpgroups own 64 rows each and stage their tile,
// rounded to 16 bits, in shared memory; the producer warpgroup's other 96
// threads add the bias, rotate and store it to q, k and v while the
// consumers go on with the next tile.
//
// uses hopper.cuh

#define QP_BM 128
#define QP_BN 256
#define QP_BK 64
#define QP_ST 3
#define QP_GROUP 16
#define QP_ROW 528  // a staging row's bytes: 256 values and 16 bytes of padding (no bank conflicts)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QP_ONLY(x) x
#else
#define QP_ONLY(x) __trap()
#endif

// qp_fma returns a·b + c on pairs of 16-bit values (bf16, or f16 when
// F16), rounded once. The epilogue's sums and products take it on packed
// pairs: the product of two 16-bit values, and the sum of two, rounded
// once to 16 bits, equal what the unfused kernels get by rounding the
// float32 result (exact for a product, or off the 16-bit midpoints for a
// sum) to 16 bits; the float32 forms took the epilogue's three warps
// longer than the product.
template <bool F16>
__device__ __forceinline__ u32 qp_fma(u32 a, u32 b, u32 c) {
  u32 d;
  if (F16) asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  else asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Pairs of 1, -1 and -0 (a product's addend that keeps its sign).
#define QP_ONE(F16) ((F16) ? 0x3C003C00u : 0x3F803F80u)
#define QP_NEG_ONE(F16) ((F16) ? 0xBC00BC00u : 0xBF80BF80u)
#define QP_NEG_ZERO 0x80008000u

// qp_add and qp_rope act on 4 words of 8 packed values: qp_add adds b to x,
// and qp_rope rotates (x1, x2) by (c, s) as rope_pair does:
// y1 = x1·c − x2·s, y2 = x2·c + x1·s, each product rounded.
template <bool F16>
__device__ __forceinline__ void qp_add(uint4& x, uint4 b) {
  x.x = qp_fma<F16>(x.x, QP_ONE(F16), b.x);
  x.y = qp_fma<F16>(x.y, QP_ONE(F16), b.y);
  x.z = qp_fma<F16>(x.z, QP_ONE(F16), b.z);
  x.w = qp_fma<F16>(x.w, QP_ONE(F16), b.w);
}
template <bool F16>
__device__ __forceinline__ u32 qp_rope1(u32 a, u32 b, u32 c, u32 s) {
  u32 p = qp_fma<F16>(a, c, QP_NEG_ZERO), q = qp_fma<F16>(b, s, QP_NEG_ZERO);
  return qp_fma<F16>(q, QP_NEG_ONE(F16), p);
}
template <bool F16>
__device__ __forceinline__ u32 qp_rope2(u32 a, u32 b, u32 c, u32 s) {
  u32 p = qp_fma<F16>(b, c, QP_NEG_ZERO), q = qp_fma<F16>(a, s, QP_NEG_ZERO);
  return qp_fma<F16>(p, QP_ONE(F16), q);
}
template <bool F16>
__device__ __forceinline__ void qp_rope(uint4& x1, uint4& x2, uint4 c, uint4 s) {
  uint4 y1 = make_uint4(qp_rope1<F16>(x1.x, x2.x, c.x, s.x), qp_rope1<F16>(x1.y, x2.y, c.y, s.y),
                        qp_rope1<F16>(x1.z, x2.z, c.z, s.z), qp_rope1<F16>(x1.w, x2.w, c.w, s.w));
  uint4 y2 = make_uint4(qp_rope2<F16>(x1.x, x2.x, c.x, s.x), qp_rope2<F16>(x1.y, x2.y, c.y, s.y),
                        qp_rope2<F16>(x1.z, x2.z, c.z, s.z), qp_rope2<F16>(x1.w, x2.w, c.w, s.w));
  x1 = y1, x2 = y2;
}

// qp_item is the epilogue's work for one row of a staged tile (tile row
// row, token r) and one group g of 8 RoPE pairs: columns 8g.. and 8g+d/2..
// of each of the tile's heads (from h0), whose cos and sin (from the table
// cs: per token d/2 cosines, then d/2 sines) serve every q and k head of
// the tile; a v head takes the same columns without rotation.
template <bool F16>
__device__ __forceinline__ void qp_item(u16* __restrict__ q, u16* __restrict__ k, u16* __restrict__ v,
                                       const u16* __restrict__ bias, const u16* __restrict__ cs, const char* stage,
                                       int row, int g, int r, int h0, int hq, int hkv, int d) {
  int half = d / 2, hpt = QP_BN / d, nh = hq + 2 * hkv;
  uint4 c = make_uint4(0, 0, 0, 0), s = c;
  if (h0 < hq + hkv) {
    const u16* t = cs + (i64)r * d + g * 8;
    c = __ldg((const uint4*)t);
    s = __ldg((const uint4*)(t + half));
  }
  for (int h = 0; h < hpt && h0 + h < nh; h++) {
    int hg = h0 + h;
    const char* src = stage + row * QP_ROW + (h * d + g * 8) * 2;
    uint4 x1 = *(const uint4*)src, x2 = *(const uint4*)(src + half * 2);
    if (bias) {
      int col = hg * d + g * 8;
      qp_add<F16>(x1, __ldg((const uint4*)(bias + col)));
      qp_add<F16>(x2, __ldg((const uint4*)(bias + col + half)));
    }
    u16* dst;
    if (hg < hq) {
      dst = q + ((i64)r * hq + hg) * d;
    } else if (hg < hq + hkv) {
      dst = k + ((i64)r * hkv + hg - hq) * d;
    } else {
      dst = v + ((i64)r * hkv + hg - hq - hkv) * d;
    }
    if (hg < hq + hkv) qp_rope<F16>(x1, x2, c, s);
    *(uint4*)(dst + g * 8) = x1;
    *(uint4*)(dst + g * 8 + half) = x2;
  }
}

// gemm_qkv's epilogue for one staged tile (rows m0.., heads from h0),
// qp_item by qp_item; a thread takes two at a time, whose loads overlap.
template <bool F16>
__device__ __forceinline__ void qp_epilogue(u16* q, u16* k, u16* v, const u16* bias, const u16* cs, const char* stage,
                                            int m0, int m, int h0, int hq, int hkv, int d, int e) {
  int ng = d / 16, n = min(QP_BM, m - m0) * ng;
#pragma unroll 2
  for (int item = e; item < n; item += 96) {
    int row = item / ng, g = item - row * ng;
    qp_item<F16>(q, k, v, bias, cs, stage, row, g, m0 + row, h0, hq, hkv, d);
  }
}

template <bool F16>
__device__ __forceinline__ void gemm_qkv(u16* q, u16* k, u16* v, const u16* bias, const u16* cs, int* ctr,
                                         const TMap* tx, const TMap* tw, int m, int hq, int hkv, int d, int kd) {
  constexpr int AT = QP_BM * QP_BK * 2, BT = QP_BN * QP_BK * 2, ST = AT + BT;
  // The ring, the staging tile, their mbarriers and the tile queue
  // (3 epilogue warps).
  const WgStaged w = wg_staged<QP_ST, false>(ST, QP_BM, QP_ROW, 3);
  const u32 base = w.base, bars = w.bars, staged = w.staged, drained = w.drained, tqb = w.tqb, stage = w.stage;
  const char* gstage = w.gstage;
  int* tq = w.tq;
  int n = (hq + 2 * hkv) * d;
  int nm = (m + QP_BM - 1) / QP_BM, nn = (n + QP_BN - 1) / QP_BN, nk = kd / QP_BK, nt_all = nm * nn;
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 88;\n" ::: "memory");
    if (threadIdx.x == 0) {
      wg_produce<QP_ST, QP_GROUP>(base, bars, ST, nk, tqb, tq, ctr, nt_all, nm, nn,
                                  [&](u32 st, u32 full, int mt, int nt, int kb) {
                                    tma_load3(st, tx, kb * QP_BK, 0, mt * QP_BM, full);
                                    tma_load3(st + AT, tw, kb * QP_BK, 0, nt * QP_BN, full);
                                  });
    } else if (threadIdx.x >= 32) {
      for (int i = 0, t; (t = tq_get(tqb, tq, i)) >= 0; i++) {
        int mt, nt;
        wg_tile_order<QP_GROUP>(t, nm, nn, mt, nt);
        mb_wait(staged, i & 1);
        qp_epilogue<F16>(q, k, v, bias, cs, gstage, mt * QP_BM, m, nt * QP_BN / d, hq, hkv, d, threadIdx.x - 32);
        warp_arrive(drained);
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 208;\n" ::: "memory");
  wg_consume<F16, QP_ST, 256, false>(base, bars, ST, AT, nk, tqb, tq, stage, QP_ROW, staged, drained);
}

// k_rope_cs16 writes the table cs [m, d] of 16-bit values (bf16, or f16
// when F16): per token the d/2 cosines and then the d/2 sines of rope_cs,
// which are exact in the dtype.
template <bool F16>
__device__ __forceinline__ void rope_cs16(u16* cs, const int* pos, int m, int d, const InvFreq& inv) {
  const int dt = F16 ? DT_F16 : DT_BF16;
  int half = d / 2;
  GRID_STRIDE(e, (i64)m * half) {
    i64 r = e / half;
    int i = (int)(e - r * half);
    float c, s;
    rope_cs((float)pos[r], inv.v[i], dt, 0, &c, &s);
    cs[r * d + i] = F16 ? f2h(c) : f2bf(c);
    cs[r * d + half + i] = F16 ? f2h(s) : f2bf(s);
  }
}

extern "C" __global__ void k_rope_cs16_bf16(u16* cs, const int* pos, int m, int d, InvFreq inv) {
  rope_cs16<false>(cs, pos, m, d, inv);
}
extern "C" __global__ void k_rope_cs16_f16(u16* cs, const int* pos, int m, int d, InvFreq inv) {
  rope_cs16<true>(cs, pos, m, d, inv);
}
// bias is 0 when the projections have none; cs is k_rope_cs16's table.
extern "C" __global__ void __launch_bounds__(384, 1) k_gemm_qkv_bf16(u16* q, u16* k, u16* v, const u16* bias, const u16* cs, int* ctr, const __grid_constant__ TMap tx, const __grid_constant__ TMap tw, int m, int hq, int hkv, int d, int kd) {
  QP_ONLY((gemm_qkv<false>(q, k, v, bias, cs, ctr, &tx, &tw, m, hq, hkv, d, kd)));
}
extern "C" __global__ void __launch_bounds__(384, 1) k_gemm_qkv_f16(u16* q, u16* k, u16* v, const u16* bias, const u16* cs, int* ctr, const __grid_constant__ TMap tx, const __grid_constant__ TMap tw, int m, int hq, int hkv, int d, int kd) {
  QP_ONLY((gemm_qkv<true>(q, k, v, bias, cs, ctr, &tx, &tw, m, hq, hkv, d, kd)));
}
