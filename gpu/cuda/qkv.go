//go:build cgo

package cuda

import (
	"github.com/rlpipe/rlpipe/gpu"
)

// QKVSplit writes q, k and v from the fused projection in one pass:
// k_qkv_split8 (8 elements a thread) for head dims that are multiples of 16
// at 16-byte aligned addresses (k_qkv_split8_bf16 or _f16 where every
// operand, the bias too, is of that dtype), k_qkv_split otherwise; the
// values of the steps (gpu.QKVSplitSteps).
func (b *Backend) QKVSplit(q, k, v, qkv, bias, pos gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) error {
	const op = "qkv split"
	t, hq, hkv, d, err := gpu.QKVDims(op, "", q, k, v, qkv, bias, pos)
	if err != nil {
		return err
	}
	as, err := b.qkvAddrs(op, []named{arg("q", q), arg("k", k), arg("v", v), arg("qkv", qkv)}, pos)
	if err != nil {
		return err
	}
	var ba uint64
	hasb := bias.Mem != nil
	if hasb {
		if ba, err = b.faddr(op, "bias", bias); err != nil {
			return err
		}
	}
	tbl, err := ropeTable(op, d, theta, scaling)
	if err != nil {
		return err
	}
	vec := d%16 == 0 && vec8(8, as[:4]...) && (!hasb || vec8(8, ba))
	args := new(kargs).u64(as[0]).u64(as[1]).u64(as[2]).u64(as[3]).u64(ba).dt(bias.DType).i32(b2i(hasb)).
		dt(q.DType).u64(as[4]).i64(int64(t)).i32(hq).i32(hkv).i32(d).put(tbl)
	return b.qkvLaunch(qkvKernel("k_qkv_split", vec, q.DType, !hasb || bias.DType == q.DType), vec, t, hq, hkv, d, args)
}

// QKVPack writes dqkv from dq and dk rotated back and dv in one pass
// (k_qkv_pack8, its 16-bit forms, or k_qkv_pack, as for QKVSplit), leaving
// dq and dk as they are; the values of the steps (gpu.QKVPackSteps).
func (b *Backend) QKVPack(dqkv, dq, dk, dv, pos gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) error {
	const op = "qkv pack"
	t, hq, hkv, d, err := gpu.QKVDims(op, "d", dq, dk, dv, dqkv, gpu.Tensor{}, pos)
	if err != nil {
		return err
	}
	as, err := b.qkvAddrs(op, []named{arg("dq", dq), arg("dk", dk), arg("dv", dv), arg("dqkv", dqkv)}, pos)
	if err != nil {
		return err
	}
	tbl, err := ropeTable(op, d, theta, scaling)
	if err != nil {
		return err
	}
	vec := d%16 == 0 && vec8(8, as[:4]...)
	args := new(kargs).u64(as[3]).u64(as[0]).u64(as[1]).u64(as[2]).u64(as[4]).dt(dq.DType).
		i64(int64(t)).i32(hq).i32(hkv).i32(d).put(tbl)
	return b.qkvLaunch(qkvKernel("k_qkv_pack", vec, dq.DType, true), vec, t, hq, hkv, d, args)
}

// qkvAddrs returns the addresses of the four float operands and of pos.
func (b *Backend) qkvAddrs(op string, ns []named, pos gpu.Tensor) ([5]uint64, error) {
	var as [5]uint64
	var err error
	for i, n := range ns {
		if as[i], err = b.faddr(op, n.Name, n.T); err != nil {
			return as, err
		}
	}
	as[4], err = b.taddr(op, "pos", pos, gpu.I32)
	return as, err
}

// qkvKernel names the kernel of base for an 8-wide launch (vec) of
// operands of dtype dt: its bf16 or f16 form where dt is one and same says
// every operand is of it, which drops the dtype branches from every
// access (k_qkv_split8 ran at a third of the memory's speed on an H100,
// instruction-bound).
func qkvKernel(base string, vec bool, dt gpu.DType, same bool) string {
	if !vec {
		return base
	}
	switch {
	case same && dt == gpu.BF16:
		return base + "8_bf16"
	case same && dt == gpu.F16:
		return base + "8_f16"
	}
	return base + "8"
}

// qkvLaunch issues kernel name (an 8-wide one when vec) over t tokens,
// each block taking tb of them: enough for about 1024 accesses (four a
// thread), at most 16, and few enough that their cos and sin stay within
// 4096 entries each; the block's dynamic shared memory holds exactly its tb
// tokens' tables.
func (b *Backend) qkvLaunch(name string, vec bool, t, hq, hkv, d int, args *kargs) error {
	if t == 0 {
		return nil
	}
	w := 1
	if vec {
		w = 8
	}
	per := ((hq+hkv)*d/2 + hkv*d) / w
	tb := max(min((1024+per-1)/per, 16, 4096/(d/2)), 1)
	return b.issue(launch{name: name, gx: rowGrid((int64(t) + int64(tb) - 1) / int64(tb)), gy: 1, gz: 1, bx: 256, by: 1, bz: 1,
		smem: 2 * tb * (d / 2) * 4, args: args.i32(tb)})
}
