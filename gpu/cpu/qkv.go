package cpu

import (
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
)

// QKVSplit runs its steps (gpu.QKVSplitSteps): the CPU backend has no fused
// kernel.
func (b *Backend) QKVSplit(q, k, v, qkv, bias, pos gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) error {
	return gpu.QKVSplitSteps(b, b, q, k, v, qkv, bias, pos, theta, scaling)
}

// QKVPack runs its steps (gpu.QKVPackSteps).
func (b *Backend) QKVPack(dqkv, dq, dk, dv, pos gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) error {
	return gpu.QKVPackSteps(b, b, dqkv, dq, dk, dv, pos, theta, scaling)
}

// CopyColumns copies columns [srcCol, srcCol+n) of src [T,*] into columns
// [dstCol, dstCol+n) of dst [T,*], rounding to dst's dtype.
func (b *Backend) CopyColumns(dst gpu.Tensor, dstCol int, src gpu.Tensor, srcCol, n int) error {
	const op = "copy columns"
	if err := gpu.CheckRank(op, "dst", dst, 2); err != nil {
		return err
	}
	if err := gpu.CheckRank(op, "src", src, 2); err != nil {
		return err
	}
	t, dw, sw := dst.Shape[0], dst.Shape[1], src.Shape[1]
	if src.Shape[0] != t {
		return fmt.Errorf("%s: dst has %d rows, src %d", op, t, src.Shape[0])
	}
	if n < 0 || dstCol < 0 || srcCol < 0 || dstCol+n > dw || srcCol+n > sw {
		return fmt.Errorf("%s: columns [%d,%d) of dst [%d,%d] or [%d,%d) of src [%d,%d] are out of range",
			op, dstCol, dstCol+n, t, dw, srcCol, srcCol+n, t, sw)
	}
	if err := gpu.CheckNoAlias(op, "dst", "src", dst, src); err != nil {
		return err
	}
	dv, err := floatView(op, "dst", dst)
	if err != nil {
		return err
	}
	sv, err := floatView(op, "src", src)
	if err != nil {
		return err
	}
	b.parallel(t, rowChunk(n), func(_, lo, hi int) {
		buf := make([]float32, n)
		for r := lo; r < hi; r++ {
			dv.store(r*dw+dstCol, sv.get(buf, r*sw+srcCol, n))
		}
	})
	return nil
}
