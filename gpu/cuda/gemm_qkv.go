//go:build cgo

package cuda

import (
	"fmt"
	"os"

	"github.com/rlpipe/rlpipe/gpu"
)

// The q, k and v projections with their biases and RoPE in the epilogue
// (k_gemm_qkv_*, kernels/gemm_qkv.cu): persistent CTAs of qpThreads threads
// take tiles of qpBM rows and qpBN columns (whole heads) from the stream's
// tile queue (kernels/hopper.cuh; the counter is Stream.tileCounter), with
// qpStages buffers of a qpBK-wide step of the reduction and a staging tile of qpBM
// rows of qpRow bytes for the epilogue.
const (
	qpBM, qpBN, qpBK = 128, 256, 64
	qpStages         = 3
	qpRow            = 528
	qpThreads        = 3 * 128
)

// qkvRoPEOff turns QKVRoPE off (RLPIPE_CUDA_GEMM_QKV=0): it then refuses
// every call, and the model runs the product and QKVSplit.
var qkvRoPEOff = os.Getenv("RLPIPE_CUDA_GEMM_QKV") == "0"

// QKVRoPE writes q [T,hq,d], k and v [T,hkv,d] from x [T,K] and the fused
// projection weight w [(hq+2·hkv)·d, K] in one kernel: the values of Gemm
// (x·wᵀ rounded to the dtype) and then QKVSplit with bias (which may be
// the zero Tensor), pos, theta and scaling, up to the product's
// accumulation order; the product never reaches memory. scratch is the
// product's buffer [T, (hq+2·hkv)·d] of the unfused ops (qkv in errors): this op
// overwrites its first T·d values with each token's cos and sin, which a
// first kernel (k_rope_cs16_*) computes once for every head and tile.
// Every float operand is bf16 (or every one f16), K a multiple of 64, d 64
// or 128, the operands 16-byte aligned, on Hopper; others give an error
// wrapping gpu.ErrNotFused, as does RLPIPE_CUDA_GEMM_QKV=0.
func (b *Backend) QKVRoPE(q, k, v, x, w, bias, pos, scratch gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) error {
	const op = "qkv rope"
	if qkvRoPEOff {
		return fmt.Errorf("%s: RLPIPE_CUDA_GEMM_QKV=0: %w", op, gpu.ErrNotFused)
	}
	// scratch takes the product's place (qkv) in QKVSplit's checks.
	t, hq, hkv, d, err := gpu.QKVDims(op, "", q, k, v, scratch, bias, pos)
	if err != nil {
		return err
	}
	if err := gpu.CheckRank(op, "x", x, 2); err != nil {
		return err
	}
	kd, n := x.Shape[1], (hq+2*hkv)*d
	if err := gpu.CheckShape(op, "x", x, t, kd); err != nil {
		return err
	}
	if err := gpu.CheckShape(op, "w", w, n, kd); err != nil {
		return err
	}
	for _, o := range []gpu.Named{{Name: "q", T: q}, {Name: "k", T: k}, {Name: "v", T: v}, {Name: "qkv", T: scratch}} {
		if err := gpu.CheckNoAliasAll(op, o.Name, o.T, gpu.Named{Name: "x", T: x}, gpu.Named{Name: "w", T: w}); err != nil {
			return err
		}
	}
	if !b.wgmma() {
		return fmt.Errorf("%s: needs Hopper's wgmma: %w", op, gpu.ErrNotFused)
	}
	dt := x.DType
	if dt != gpu.BF16 && dt != gpu.F16 {
		return fmt.Errorf("%s: x is %v, want bf16 or f16: %w", op, dt, gpu.ErrNotFused)
	}
	ops := []named{arg("q", q), arg("k", k), arg("v", v), arg("x", x), arg("w", w), arg("scratch", scratch)}
	if bias.Mem != nil {
		ops = append(ops, arg("bias", bias))
	}
	as, err := b.fusedAddrs(op, dt, ops...)
	if err != nil {
		return err
	}
	as = append(as, 0) // no bias: 0
	if kd%qpBK != 0 || (d != 64 && d != 128) {
		return fmt.Errorf("%s: K %d not a multiple of %d or head dim %d not 64 or 128: %w", op, kd, qpBK, d, gpu.ErrNotFused)
	}
	pa, err := b.taddr(op, "pos", pos, gpu.I32)
	if err != nil {
		return err
	}
	tbl, err := ropeTable(op, d, theta, scaling)
	if err != nil {
		return err
	}
	if t == 0 {
		return nil
	}
	s, ms, err := b.persistentStart(tmapKey{as[3], t, 1, kd, qpBM}, tmapKey{as[4], n, 1, kd, qpBN})
	if err != nil {
		return err
	}
	nb := b.persistentGrid((t + qpBM - 1) / qpBM * ((n + qpBN - 1) / qpBN))
	return b.issue(
		launch{name: kernel16("k_rope_cs16", dt), gx: b.d.gridFor(int64(t) * int64(d/2)), gy: 1, gz: 1, bx: 256, by: 1, bz: 1,
			args: new(kargs).u64(as[5]).u64(pa).i32(t).i32(d).put(tbl)},
		launch{name: kernel16("k_gemm_qkv", dt), gx: nb, gy: 1, gz: 1, bx: qpThreads, by: 1, bz: 1, smem: qpSmem(),
			args: new(kargs).u64(as[0]).u64(as[1]).u64(as[2]).u64(as[6]).u64(as[5]).u64(s.tileCounter()).put(ms[0][:]).put(ms[1][:]).
				i32(t).i32(hq).i32(hkv).i32(d).i32(kd)})
}

// qpSmem is k_gemm_qkv_*'s dynamic shared memory: qpStages buffers of x's
// and w's tiles, the staging tile, a "full" and an "empty" mbarrier per
// buffer, a "staged" and a "drained" one, the tile queue, and 1 KB to
// align the tiles to 1024 bytes.
func qpSmem() int {
	return qpStages*(qpBM+qpBN)*qpBK*2 + qpBM*qpRow + (2*qpStages+2)*8 + tileQueueBytes + 1024
}
