package cuda

import (
	"fmt"
	"math"

	"github.com/rlpipe/rlpipe/gpu"
)

// Tile sizes of kernels/attention.cu.
const (
	attMaxD = 256
	attFBQ  = 16
	attBK   = 32
	attKBQ  = 32
)

// attnArgs are the checked operands of an attention call.
type attnArgs struct {
	t, hq, hkv, d, ns1 int
	q, k, v, cu        uint64
}

func (b *Backend) attnCheck(op string, q, k, v, cuSeqlens gpu.Tensor, scale float32) (attnArgs, error) {
	var a attnArgs
	if err := rank(op, "q", q, 3); err != nil {
		return a, err
	}
	if err := rank(op, "k", k, 3); err != nil {
		return a, err
	}
	a.t, a.hq, a.d = q.Shape[0], q.Shape[1], q.Shape[2]
	a.hkv = k.Shape[1]
	if a.hkv == 0 || a.hq%a.hkv != 0 {
		return a, fmt.Errorf("%s: %d query heads are not a multiple of %d kv heads", op, a.hq, a.hkv)
	}
	if err := need(op, "k", k, a.t, a.hkv, a.d); err != nil {
		return a, err
	}
	if err := need(op, "v", v, a.t, a.hkv, a.d); err != nil {
		return a, err
	}
	if err := rank(op, "cuSeqlens", cuSeqlens, 1); err != nil {
		return a, err
	}
	a.ns1 = cuSeqlens.Shape[0]
	if a.ns1 == 0 {
		return a, fmt.Errorf("%s: cuSeqlens must start at 0 and end at %d tokens, got []", op, a.t)
	}
	if a.d > attMaxD {
		return a, fmt.Errorf("%s: head dim %d exceeds %d", op, a.d, attMaxD)
	}
	if math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0) {
		return a, fmt.Errorf("%s: scale %v is not finite", op, scale)
	}
	var err error
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

// checkCu is the launch validating cuSeqlens on the device (reported by the
// next Sync; the attention kernels clamp so that bad offsets never read out
// of bounds).
func (b *Backend) checkCu(a attnArgs) launch {
	return launch{name: "k_check_cu", gx: 1, gy: 1, gz: 1, bx: 256, by: 1, bz: 1,
		args: new(kargs).u64(a.cu).i32(a.ns1).i32(a.t).u64(b.d.flag)}
}

// Attention computes causal varlen GQA attention with an online softmax
// (SIMT kernel; O(T) memory; saves lse [Hq,T]).
func (b *Backend) Attention(out, lse, q, k, v, cuSeqlens gpu.Tensor, scale float32) error {
	const op = "attention"
	a, err := b.attnCheck(op, q, k, v, cuSeqlens, scale)
	if err != nil {
		return err
	}
	if err := need(op, "out", out, a.t, a.hq, a.d); err != nil {
		return err
	}
	if err := need(op, "lse", lse, a.hq, a.t); err != nil {
		return err
	}
	ins := []named{{"q", q}, {"k", k}, {"v", v}, {"cuSeqlens", cuSeqlens}}
	if err := noAliasAll(op, "out", out, ins...); err != nil {
		return err
	}
	if err := noAliasAll(op, "lse", lse, append(ins, named{"out", out})...); err != nil {
		return err
	}
	oa, err := b.faddr(op, "out", out)
	if err != nil {
		return err
	}
	la, err := b.taddr(op, "lse", lse, gpu.F32)
	if err != nil {
		return err
	}
	if a.t == 0 || a.hq == 0 {
		return nil
	}
	d := a.d
	smem := 4 * (attBK*(d+1) + attBK*d + attFBQ*d)
	return b.issue(b.checkCu(a), launch{name: "k_attn_fwd", gx: uint32((a.t + attFBQ - 1) / attFBQ), gy: uint32(a.hq), gz: 1,
		bx: 128, by: 1, bz: 1, smem: smem,
		args: new(kargs).u64(oa).dt(out.DType).u64(la).u64(a.q).dt(q.DType).u64(a.k).dt(k.DType).u64(a.v).dt(v.DType).
			u64(a.cu).i32(a.ns1).i32(a.t).i32(a.hq).i32(a.hkv).i32(d).f32(scale)})
}

// AttentionBackward computes dq, dk and dv in two passes (dq per query
// block; dk and dv per key block, summing the group's query heads in the
// block, so K and V are never replicated and no atomics are used).
func (b *Backend) AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, cuSeqlens gpu.Tensor, scale float32) error {
	const op = "attention backward"
	a, err := b.attnCheck(op, q, k, v, cuSeqlens, scale)
	if err != nil {
		return err
	}
	for _, c := range []struct {
		n    string
		t    gpu.Tensor
		h, d int
	}{{"dq", dq, a.hq, a.d}, {"dk", dk, a.hkv, a.d}, {"dv", dv, a.hkv, a.d}, {"dout", dout, a.hq, a.d}, {"out", out, a.hq, a.d}} {
		if err := need(op, c.n, c.t, a.t, c.h, c.d); err != nil {
			return err
		}
	}
	if err := need(op, "lse", lse, a.hq, a.t); err != nil {
		return err
	}
	outs := []named{{"dq", dq}, {"dk", dk}, {"dv", dv}}
	ins := []named{{"dout", dout}, {"out", out}, {"lse", lse}, {"q", q}, {"k", k}, {"v", v}, {"cuSeqlens", cuSeqlens}}
	for i, o := range outs {
		if err := noAliasAll(op, o.n, o.t, ins...); err != nil {
			return err
		}
		if err := noAliasAll(op, o.n, o.t, outs[:i]...); err != nil {
			return err
		}
	}
	var as [5]uint64
	for i, x := range []named{{"dq", dq}, {"dk", dk}, {"dv", dv}, {"dout", dout}, {"out", out}} {
		if as[i], err = b.faddr(op, x.n, x.t); err != nil {
			return err
		}
	}
	la, err := b.taddr(op, "lse", lse, gpu.F32)
	if err != nil {
		return err
	}
	if a.t == 0 || a.hq == 0 {
		return nil
	}
	d := a.d
	smemQ := 4 * (2*attBK*(d+1) + 2*attFBQ*d)
	smemK := 4 * (2*attBK*(d+1) + 2*attKBQ*(d+1) + 2*attBK*d + 3*attKBQ)
	return b.issue(b.checkCu(a),
		launch{name: "k_attn_bwd_dq", gx: uint32((a.t + attFBQ - 1) / attFBQ), gy: uint32(a.hq), gz: 1, bx: 128, by: 1, bz: 1, smem: smemQ,
			args: new(kargs).u64(as[0]).dt(dq.DType).u64(as[3]).dt(dout.DType).u64(as[4]).dt(out.DType).u64(la).
				u64(a.q).dt(q.DType).u64(a.k).dt(k.DType).u64(a.v).dt(v.DType).u64(a.cu).i32(a.ns1).i32(a.t).i32(a.hq).i32(a.hkv).i32(d).f32(scale)},
		launch{name: "k_attn_bwd_dkv", gx: uint32((a.t + attBK - 1) / attBK), gy: uint32(a.hkv), gz: 1, bx: 128, by: 1, bz: 1, smem: smemK,
			args: new(kargs).u64(as[1]).dt(dk.DType).u64(as[2]).dt(dv.DType).u64(as[3]).dt(dout.DType).u64(as[4]).dt(out.DType).u64(la).
				u64(a.q).dt(q.DType).u64(a.k).dt(k.DType).u64(a.v).dt(v.DType).u64(a.cu).i32(a.ns1).i32(a.t).i32(a.hq).i32(a.hkv).i32(d).f32(scale)})
}
