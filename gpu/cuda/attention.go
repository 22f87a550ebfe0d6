//go:build cgo

package cuda

import (
	"fmt"
	"strings"

	"github.com/rlpipe/rlpipe/gpu"
)

// Tile sizes of kernels/attention.cu.
const (
	attMaxD = 256
	attFBQ  = 16
	attBK   = 32
	attKBQ  = 32
)

// Tile sizes of the tensor-core kernels (k_fa_* in kernels/attention.cu):
// 64 query rows per forward and dq CTA, 64 keys per dk/dv CTA, 64-key tiles
// in the forward and dq kernels, 64-row query tiles in the dk/dv kernel;
// 128 threads each. Shared memory, in 64-row tiles of faTile(d) bytes: the
// forward holds Q, K, V (3 tiles); the dq kernel Q, dout, K, V (4); the
// dk/dv kernel K, V and two buffers of Q and dout (6, plus lse, delta and
// sequence starts of two query tiles).
const (
	faBM = 64
	faBN = 64
)

// attnSIMTOnly makes Attention and AttentionBackward always use the SIMT
// kernels (tests and timing probes compare the two paths).
var attnSIMTOnly bool

// attnNoWgmma makes the tensor-core path use the mma.sync kernels (k_fa_*)
// on Hopper too, instead of the wgmma ones (k_wg_*), for tests and timing
// probes that compare the two.
var attnNoWgmma bool

// attnBwdOnly, "dq" or "dkv", makes the tensor-core AttentionBackward
// launch only that pass after the delta pass, for timing probes (the
// results are then incomplete).
var attnBwdOnly string

// The wgmma kernels (kernels/attention.cu): the forward's CTA is two
// warpgroups (256 threads) owning 128 query rows and sharing wgBN-key tiles
// of K and V, two buffers each (two CTAs an SM); the dq CTA is one warpgroup owning 64 rows,
// with the tiles of the mma.sync kernel (faBM, faBN); the dk/dv CTA is a
// producer warpgroup and two consumers (384 threads) owning 128 keys and
// sharing wgStages buffers of 64-row Q and dout tiles.
const (
	wgBM         = 128
	wgBN         = 64
	wgFwdThreads = 2 * 128
	wgDkvThreads = 3 * 128
	wgStages     = 3 // WG_DKV_STAGES
)

// wgSmem returns the dynamic shared memory of the wgmma kernel op ("fwd",
// "dq" or "dkv") at head dim d: its swizzled tiles of 16-bit elements (the
// forward: Q, and two buffers of K and V; dq: Q, dout, K and V; dk/dv: K, V
// and the buffers of Q and dout), the dk/dv kernel's per-row lse, delta and
// sequence start and two mbarriers per buffer, and 1 KB to align the tiles
// to 1024 bytes.
func wgSmem(op string, d int) int {
	tile := faBM * d * 2
	switch op {
	case "fwd":
		return wgBM*d*2 + 2*2*wgBN*d*2 + 1024
	case "dq":
		return 4*tile + 1024
	default:
		return 2*wgBM*d*2 + 2*wgStages*tile + 3*wgStages*faBN*4 + 2*wgStages*8 + 1024
	}
}

// orderMax is ORDER_MAX of kernels/attention.cu: k_attn_order sorts up
// to this many blocks.
const orderMax = 16384

// orderLaunch is the launch of k_attn_order writing, at device address
// ord, the order of the nb blocks of rows rows (key blocks with keys) of
// a's batch: heaviest first.
func orderLaunch(a attnArgs, rows, nb int, keys bool, ord uint64) launch {
	smem := 0
	if nb <= orderMax {
		n := 1
		for n < nb {
			n <<= 1
		}
		smem = 8 * n
	}
	k := 0
	if keys {
		k = 1
	}
	return launch{name: "k_attn_order", gx: 1, gy: 1, gz: 1, bx: 1024, by: 1, bz: 1, smem: smem,
		args: new(kargs).u64(a.cu).i32(a.ns1).i32(a.t).i32(rows).i32(k).i32(nb).u64(ord)}
}

// wgmma reports whether the causal attention kernels run as Hopper's
// wgmma ones here (not under attnNoWgmma).
func (b *Backend) wgmma() bool { return b.d.info.Hopper() && !attnNoWgmma }

// tcLaunch returns the launches of tensor-core kernel op ("fwd", "dq",
// "dkv") for suffix sfx (faSuffix) over a's t rows of heads heads on this
// device. On Hopper: k_attn_order writing the order of the kernel's blocks
// at device address ord (room for t/64 ints), then k_wg_<op>_<sfx>, one
// CTA per block and head, the heaviest blocks first, taking the order as
// its last argument. Elsewhere, or under attnNoWgmma: k_fa_<op>_<sfx> (64
// rows and 128 threads a CTA, faSmem bytes of shared memory) over a grid
// of blocks × heads.
func (b *Backend) tcLaunch(op, sfx string, a attnArgs, heads, faSmem int, args *kargs, ord uint64) []launch {
	t := a.t
	l := launch{name: "k_fa_" + op + "_" + sfx, gx: uint32((t + faBM - 1) / faBM), gy: uint32(heads), gz: 1,
		bx: 128, by: 1, bz: 1, smem: faSmem, args: args}
	if !b.wgmma() {
		return []launch{l}
	}
	l.name, l.smem = "k_wg_"+op+"_"+sfx, wgSmem(op, a.d)
	rows := faBM
	switch op {
	case "fwd":
		rows, l.bx = wgBM, wgFwdThreads
	case "dkv":
		rows, l.bx = wgBM, wgDkvThreads
	}
	nb := (t + rows - 1) / rows
	l.gx, l.gy, l.args = uint32(nb*heads), 1, args.u64(ord)
	return []launch{orderLaunch(a, rows, nb, op == "dkv", ord), l}
}

// faSuffix returns the "<dtype>_<D>" suffix of the tensor-core kernels that
// handle a call whose head dim is d and whose tensors (16-bit operands and
// results) are ts at device addresses as, or "" when the SIMT kernels must
// run: the tensor-core path needs one 16-bit float dtype for every tensor,
// a head dim of 64 or 128, and 16-byte aligned addresses.
func faSuffix(d int, ts []gpu.Tensor, as []uint64) string {
	if attnSIMTOnly || (d != 64 && d != 128) || len(ts) == 0 {
		return ""
	}
	dt := ts[0].DType
	if dt != gpu.BF16 && dt != gpu.F16 {
		return ""
	}
	for i, x := range ts {
		if x.DType != dt || as[i]%16 != 0 {
			return ""
		}
	}
	name := "bf16"
	if dt == gpu.F16 {
		name = "f16"
	}
	return fmt.Sprintf("%s_%d", name, d)
}

// faTile is the shared-memory bytes of one 64-row tile of head dim d (rows
// padded by 8 elements).
func faTile(d int) int { return faBM * (d + 8) * 2 }

// attnArgs are the checked operands of an attention call.
type attnArgs struct {
	t, hq, hkv, d, ns1 int
	q, k, v, cu        uint64
}

func (b *Backend) attnCheck(op string, q, k, v, cuSeqlens gpu.Tensor, scale float32) (attnArgs, error) {
	var a attnArgs
	var err error
	if a.t, a.hq, a.hkv, a.d, err = gpu.AttentionDims(op, q, k, v, cuSeqlens, scale); err != nil {
		return a, err
	}
	a.ns1 = cuSeqlens.Shape[0]
	if a.ns1 == 0 {
		return a, fmt.Errorf("%s: cuSeqlens must start at 0 and end at %d tokens, got []", op, a.t)
	}
	if a.d > attMaxD {
		return a, fmt.Errorf("%s: head dim %d exceeds %d", op, a.d, attMaxD)
	}
	if a.q, err = b.faddr(op, "q", q); err != nil {
		return a, err
	}
	if a.k, err = b.faddr(op, "k", k); err != nil {
		return a, err
	}
	if a.v, err = b.faddr(op, "v", v); err != nil {
		return a, err
	}
	if a.cu, err = b.taddr(op, "cuSeqlens", cuSeqlens, gpu.I32); err != nil {
		return a, err
	}
	return a, nil
}

// outLSE returns the device addresses of an attention output and its
// log-sum-exp (F32); names are theirs for errors, "out,lse".
func (b *Backend) outLSE(op, names string, out, lse gpu.Tensor) (oa, la uint64, err error) {
	on, ln, _ := strings.Cut(names, ",")
	if oa, err = b.faddr(op, on, out); err != nil {
		return 0, 0, err
	}
	la, err = b.taddr(op, ln, lse, gpu.F32)
	return oa, la, err
}

// backwardAddrs returns the device addresses of an attention backward's
// dq, dk, dv, dout and out, and of its lse (F32).
func (b *Backend) backwardAddrs(op string, dq, dk, dv, dout, out, lse gpu.Tensor) (as [5]uint64, la uint64, err error) {
	for i, x := range []named{arg("dq", dq), arg("dk", dk), arg("dv", dv), arg("dout", dout), arg("out", out)} {
		if as[i], err = b.faddr(op, x.Name, x.T); err != nil {
			return as, 0, err
		}
	}
	la, err = b.taddr(op, "lse", lse, gpu.F32)
	return as, la, err
}

// checkCu is the launch validating cuSeqlens on the device (reported by the
// next Sync; the attention kernels clamp so that bad offsets never read out
// of bounds).
func (b *Backend) checkCu(a attnArgs) launch {
	return launch{name: "k_check_cu", gx: 1, gy: 1, gz: 1, bx: 256, by: 1, bz: 1,
		args: new(kargs).u64(a.cu).i32(a.ns1).i32(a.t).u64(b.d.flag)}
}

// Attention computes causal varlen GQA attention with an online softmax
// (O(T) memory; saves lse [Hq,T]). bf16 and f16 calls with head dim 64 or
// 128 run the tensor-core kernel k_fa_fwd_*; the rest (f32 included) run
// the SIMT kernel k_attn_fwd.
func (b *Backend) Attention(out, lse, q, k, v, cuSeqlens gpu.Tensor, scale float32) error {
	const op = "attention"
	a, err := b.attnCheck(op, q, k, v, cuSeqlens, scale)
	if err != nil {
		return err
	}
	if err := gpu.CheckAttention(op, out, lse, q, k, v, cuSeqlens, a.t, a.hq, a.d); err != nil {
		return err
	}
	oa, la, err := b.outLSE(op, "out,lse", out, lse)
	if err != nil {
		return err
	}
	if a.t == 0 || a.hq == 0 {
		return nil
	}
	d := a.d
	if sfx := faSuffix(d, []gpu.Tensor{q, k, v, out}, []uint64{a.q, a.k, a.v, oa}); sfx != "" {
		s, err := b.stream()
		if err != nil {
			return err
		}
		if attnFwdWS && b.wgmma() {
			ls, err := b.wsLaunch(sfx, a, oa, la, scale, uint64(s.scratch))
			if err != nil {
				return err
			}
			return b.issue(append([]launch{b.checkCu(a)}, ls...)...)
		}
		return b.issue(append([]launch{b.checkCu(a)}, b.tcLaunch("fwd", sfx, a, a.hq, 3*faTile(d),
			new(kargs).u64(oa).u64(la).u64(a.q).u64(a.k).u64(a.v).u64(a.cu).i32(a.ns1).i32(a.t).i32(a.hq).i32(a.hkv).f32(scale),
			uint64(s.scratch))...)...)
	}
	smem := 4 * (attBK*(d+1) + attBK*d + attFBQ*d)
	return b.issue(b.checkCu(a), launch{name: "k_attn_fwd", gx: uint32((a.t + attFBQ - 1) / attFBQ), gy: uint32(a.hq), gz: 1,
		bx: 128, by: 1, bz: 1, smem: smem,
		args: new(kargs).u64(oa).dt(out.DType).u64(la).u64(a.q).dt(q.DType).u64(a.k).dt(k.DType).u64(a.v).dt(v.DType).
			u64(a.cu).i32(a.ns1).i32(a.t).i32(a.hq).i32(a.hkv).i32(d).f32(scale)})
}

// AttentionBackward computes dq, dk and dv in two passes (dq per query
// block; dk and dv per key block, summing the group's query heads in the
// block, so K and V are never replicated and no atomics are used). On the
// tensor-core path a first pass k_fa_pre_* stores delta = rowsum(dout∘out)
// (fp32) and the token's sequence start (int32) in the first 8 bytes of
// each [token, head] row of dq, which the dk/dv pass reads and the dq pass,
// launched last, overwrites: the backward needs no workspace and is
// deterministic.
func (b *Backend) AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, cuSeqlens gpu.Tensor, scale float32) error {
	const op = "attention backward"
	a, err := b.attnCheck(op, q, k, v, cuSeqlens, scale)
	if err != nil {
		return err
	}
	if err := gpu.CheckAttentionBackward(op, dq, dk, dv, dout, out, lse, q, k, v, cuSeqlens, a.t, a.hq, a.hkv, a.d); err != nil {
		return err
	}
	as, la, err := b.backwardAddrs(op, dq, dk, dv, dout, out, lse)
	if err != nil {
		return err
	}
	if a.t == 0 || a.hq == 0 {
		return nil
	}
	d := a.d
	if sfx := faSuffix(d, []gpu.Tensor{q, k, v, out, dout, dq, dk, dv},
		[]uint64{a.q, a.k, a.v, as[4], as[3], as[0], as[1], as[2]}); sfx != "" {
		rows := a.t * a.hq
		common := func(l *kargs) *kargs {
			return l.u64(la).u64(a.q).u64(a.k).u64(a.v).u64(a.cu).i32(a.ns1).i32(a.t).i32(a.hq).i32(a.hkv).f32(scale)
		}
		s, err := b.stream()
		if err != nil {
			return err
		}
		// The two passes' block orders go to the two halves of the
		// stream's scratch (the second ending before its tile counter),
		// each with room for the t/64 ints of the dq pass's (t up to
		// about 32M tokens).
		if orders := (scratchUsable - streamScratchBytes/2) / 4; a.t/faBM+1 > orders {
			return fmt.Errorf("%s: %d tokens exceed the %d the block orders have room for", op, a.t, orders*faBM)
		}
		ls := []launch{b.checkCu(a),
			{name: "k_fa_pre_" + sfx, gx: uint32((rows*(d/8) + 127) / 128), gy: 1, gz: 1, bx: 128, by: 1, bz: 1,
				args: new(kargs).u64(as[0]).u64(as[3]).u64(as[4]).i32(rows).u64(a.cu).i32(a.ns1).i32(a.hq)}}
		dkv := b.tcLaunch("dkv", sfx, a, a.hkv, 2*faTile(d)+4*faBN*(d+8)*2+2*faBN*3*4,
			common(new(kargs).u64(as[1]).u64(as[2]).u64(as[0]).u64(as[3])), uint64(s.scratch))
		if attnBwdTMA && b.wgmma() {
			if err := b.dkvTMA(&dkv[len(dkv)-1], sfx, a, as[3]); err != nil {
				return err
			}
		}
		dq := b.tcLaunch("dq", sfx, a, a.hq, 4*faTile(d), common(new(kargs).u64(as[0]).u64(as[3])), uint64(s.scratch)+streamScratchBytes/2)
		if attnBwdTMA && b.wgmma() {
			if err := b.dqTMA(&dq[len(dq)-1], sfx, a); err != nil {
				return err
			}
		}
		if attnBwdOnly != "dq" {
			ls = append(ls, dkv...)
		}
		if attnBwdOnly != "dkv" {
			ls = append(ls, dq...)
		}
		return b.issue(ls...)
	}
	smemQ := 4 * (2*attBK*(d+1) + 2*attFBQ*d)
	smemK := 4 * (2*attBK*(d+1) + 2*attKBQ*(d+1) + 2*attBK*d + 4*attKBQ)
	return b.issue(b.checkCu(a),
		launch{name: "k_attn_bwd_dq", gx: uint32((a.t + attFBQ - 1) / attFBQ), gy: uint32(a.hq), gz: 1, bx: 128, by: 1, bz: 1, smem: smemQ,
			args: new(kargs).u64(as[0]).dt(dq.DType).u64(as[3]).dt(dout.DType).u64(as[4]).dt(out.DType).u64(la).
				u64(a.q).dt(q.DType).u64(a.k).dt(k.DType).u64(a.v).dt(v.DType).u64(a.cu).i32(a.ns1).i32(a.t).i32(a.hq).i32(a.hkv).i32(d).f32(scale)},
		launch{name: "k_attn_bwd_dkv", gx: uint32((a.t + attBK - 1) / attBK), gy: uint32(a.hkv), gz: 1, bx: 128, by: 1, bz: 1, smem: smemK,
			args: new(kargs).u64(as[1]).dt(dk.DType).u64(as[2]).dt(dv.DType).u64(as[3]).dt(dout.DType).u64(as[4]).dt(out.DType).u64(la).
				u64(a.q).dt(q.DType).u64(a.k).dt(k.DType).u64(a.v).dt(v.DType).u64(a.cu).i32(a.ns1).i32(a.t).i32(a.hq).i32(a.hkv).i32(d).f32(scale)})
}
