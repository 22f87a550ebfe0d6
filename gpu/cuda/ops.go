//go:build cgo

package cuda

/*
#include "rlcuda.h"
*/
import "C"

import (
	"fmt"
	"math"
	"os"
	"unsafe"

	"github.com/rlpipe/rlpipe/gpu"
)

// elem checks elementwise operands (identical shapes, float dtypes) and
// returns their addresses.
func (b *Backend) elem(op string, ts ...named) ([]uint64, error) {
	as := make([]uint64, len(ts))
	for i, x := range ts {
		if x.T.Mem == nil {
			return nil, fmt.Errorf("%s: %s is missing", op, x.Name)
		}
		if i > 0 && !gpu.SameShape(x.T.Shape, ts[0].T.Shape) {
			return nil, fmt.Errorf("%s: %s has shape %v, %s has %v", op, x.Name, x.T.Shape, ts[0].Name, ts[0].T.Shape)
		}
		a, err := b.faddr(op, x.Name, x.T)
		if err != nil {
			return nil, err
		}
		as[i] = a
	}
	return as, nil
}

// flat1 is a 1-D launch of 256-thread blocks over n elements.
func (b *Backend) flat1(name string, n int64, args *kargs) launch {
	return launch{name: name, gx: b.d.gridFor(n), gy: 1, gz: 1, bx: 256, by: 1, bz: 1, args: args}
}

// rows1 is a launch of one 256-thread block per row.
func rows1(name string, rows int64, args *kargs) launch {
	return launch{name: name, gx: rowGrid(rows), gy: 1, gz: 1, bx: 256, by: 1, bz: 1, args: args}
}

// cols32 is a launch of (32,8) blocks over n columns.
func cols32(name string, n int64, args *kargs) launch {
	return launch{name: name, gx: uint32((n + 31) / 32), gy: 1, gz: 1, bx: 32, by: 8, bz: 1, args: args}
}

// scalarOnly turns the 8-wide kernels off (RLPIPE_CUDA_SCALAR=1), to compare
// the two kinds of kernel on one machine.
var scalarOnly = os.Getenv("RLPIPE_CUDA_SCALAR") == "1"

// vec8 reports whether an elementwise kernel over n elements can take its
// *8 variant: n a multiple of 8 and every operand 16-byte aligned (the
// callers have checked that the dtypes are float dtypes).
func vec8(n int64, as ...uint64) bool {
	return n%8 == 0 && aligned16(as...)
}

// aligned16 reports whether the vector kernels may take operands at the
// addresses as: each 16-byte aligned, and RLPIPE_CUDA_SCALAR unset.
func aligned16(as ...uint64) bool {
	if scalarOnly {
		return false
	}
	for _, a := range as {
		if a%16 != 0 {
			return false
		}
	}
	return true
}

// flat8 is flat1 for a *8 kernel: 256-thread blocks over n/8 groups.
func (b *Backend) flat8(name string, n int64, args *kargs) launch {
	return launch{name: name + "8", gx: b.d.gridFor(n / 8), gy: 1, gz: 1, bx: 256, by: 1, bz: 1, args: args}
}

// flat picks flat8 when vec8 allows it, else flat1.
func (b *Backend) flat(name string, n int64, as []uint64, args *kargs) launch {
	if vec8(n, as...) {
		return b.flat8(name, n, args)
	}
	return b.flat1(name, n, args)
}

// Embedding gathers rows of table by ids. An id outside [0,V) is detected on
// the device: its row is zero-filled and the next Sync returns an error.
func (b *Backend) Embedding(dst, table, ids gpu.Tensor) error {
	const op = "embedding"
	v, h, t, err := gpu.EmbeddingDims(op, false, table, dst, ids)
	if err != nil {
		return err
	}
	da, err := b.faddr(op, "dst", dst)
	if err != nil {
		return err
	}
	ta, err := b.faddr(op, "table", table)
	if err != nil {
		return err
	}
	ia, err := b.taddr(op, "ids", ids, gpu.I32)
	if err != nil {
		return err
	}
	return b.issue(rows1("k_embedding", int64(t), new(kargs).u64(da).dt(dst.DType).u64(ta).dt(table.DType).u64(ia).
		i64(int64(t)).i64(int64(h)).i64(int64(v)).u64(b.d.flag)))
}

// CopyRows copies dst[rows[j]] = src[rows[j]], one block per listed row,
// in 16-byte words where the rows allow. A row outside [0,V) is detected
// on the device: it is skipped and the next Sync returns an error.
func (b *Backend) CopyRows(dst, src, rows gpu.Tensor) error {
	const op = "copy rows"
	v, h, r, err := gpu.CopyRowsDims(op, dst, src, rows)
	if err != nil {
		return err
	}
	da, err := b.addr(op, "dst", dst)
	if err != nil {
		return err
	}
	sa, err := b.addr(op, "src", src)
	if err != nil {
		return err
	}
	ra, err := b.taddr(op, "rows", rows, gpu.I32)
	if err != nil {
		return err
	}
	w := int64(h * src.DType.Size())
	if r == 0 || w == 0 {
		return nil
	}
	name := "k_copy_rows_b"
	if w%16 == 0 && da%16 == 0 && sa%16 == 0 {
		name, w = "k_copy_rows", w/16
	}
	return b.issue(rows1(name, int64(r), new(kargs).u64(da).u64(sa).u64(ra).i64(int64(r)).i64(w).i64(int64(v)).u64(b.d.flag)))
}

// EmbeddingBackward accumulates dTable[ids[t]] += dY[t]. It is
// deterministic and rounds like the CPU backend: one thread per column walks
// the tokens in order (no atomics), so its parallelism is H threads.
func (b *Backend) EmbeddingBackward(dTable, dY, ids gpu.Tensor) error {
	const op = "embedding backward"
	v, h, t, err := gpu.EmbeddingDims(op, true, dTable, dY, ids)
	if err != nil {
		return err
	}
	da, err := b.faddr(op, "dTable", dTable)
	if err != nil {
		return err
	}
	ya, err := b.faddr(op, "dY", dY)
	if err != nil {
		return err
	}
	ia, err := b.taddr(op, "ids", ids, gpu.I32)
	if err != nil {
		return err
	}
	if h == 0 || t == 0 {
		return nil
	}
	cols := (int64(h) + 127) / 128
	nb := embeddingBuckets(cols, int64(b.d.info.SMs))
	return b.issue(launch{name: "k_embedding_bwd_b", gx: uint32(cols), gy: uint32(nb), gz: 1, bx: 128, by: 1, bz: 1,
		args: new(kargs).u64(da).dt(dTable.DType).u64(ya).dt(dY.DType).u64(ia).i64(int64(t)).i64(int64(h)).i64(int64(v)).
			i32(int(nb)).u64(b.d.flag)})
}

// embeddingBuckets is the number of id buckets for k_embedding_bwd_b with
// cols blocks of 128 columns: about four blocks per SM in all, at most 64
// buckets, at least 1.
func embeddingBuckets(cols, sms int64) int64 {
	return max(min(4*max(sms, 1)/max(cols, 1), 64), 1)
}

// RMSNorm normalises the rows of x as HF Llama/Qwen2 RMSNorm does: rows
// of float32 into bf16 or f16 of 264 to 4096 values a warp per row with
// the row in registers (k_rmsnorm_r*, normRowKernel), rows of at most 256
// values a warp per row (k_rmsnorm8_w), others a block per row
// (k_rmsnorm8), all 8 values a thread at 16-byte aligned addresses, else
// the scalar k_rmsnorm.
func (b *Backend) RMSNorm(dst, rstd, x, w gpu.Tensor, eps float32) error {
	const op = "rmsnorm"
	t, h, err := gpu.RMSNormDims(op, dst, rstd, x, w, eps)
	if err != nil {
		return err
	}
	xa, err := b.faddr(op, "x", x)
	if err != nil {
		return err
	}
	da, err := b.faddr(op, "dst", dst)
	if err != nil {
		return err
	}
	wa, err := b.faddr(op, "w", w)
	if err != nil {
		return err
	}
	ra, err := b.taddr(op, "rstd", rstd, gpu.F32)
	if err != nil {
		return err
	}
	args := new(kargs).u64(da).dt(dst.DType).u64(ra).u64(xa).dt(x.DType).u64(wa).dt(w.DType).i64(int64(t)).i64(int64(h)).f32(eps)
	if vec8(int64(h), da, xa, wa) {
		if name, ok := normRowKernel(int64(h), x.DType, dst.DType, w.DType); ok {
			return b.issue(launch{name: name, gx: rowGrid((int64(t) + 7) / 8), gy: 1, gz: 1, bx: 256, by: 1, bz: 1,
				args: new(kargs).u64(da).u64(ra).u64(xa).u64(wa).i64(int64(t)).i64(int64(h)).f32(eps)})
		}
		if int64(h)/8 <= warpGroups {
			return b.issue(launch{name: "k_rmsnorm8_w", gx: rowGrid((int64(t) + 7) / 8), gy: 1, gz: 1, bx: 256, by: 1, bz: 1, args: args})
		}
		return b.issue(launch{name: "k_rmsnorm8", gx: rowGrid(int64(t)), gy: 1, gz: 1, bx: groupBlock(int64(h)/8, 1024), by: 1, bz: 1, args: args})
	}
	return b.issue(rows1("k_rmsnorm", int64(t), args))
}

// RMSNormBackward computes dx and accumulates dw (float64 column sums over
// the rows, reduced in a fixed order).
func (b *Backend) RMSNormBackward(dx, dw, dy, x, w, rstd gpu.Tensor) error {
	const op = "rmsnorm backward"
	t, h, err := gpu.RMSNormBackwardDims(op, dx, dw, dy, x, w, rstd)
	if err != nil {
		return err
	}
	withDW := dw.Mem != nil
	dxa, err := b.faddr(op, "dx", dx)
	if err != nil {
		return err
	}
	dya, err := b.faddr(op, "dy", dy)
	if err != nil {
		return err
	}
	xa, err := b.faddr(op, "x", x)
	if err != nil {
		return err
	}
	wa, err := b.faddr(op, "w", w)
	if err != nil {
		return err
	}
	ra, err := b.taddr(op, "rstd", rstd, gpu.F32)
	if err != nil {
		return err
	}
	var dwa uint64
	if withDW {
		if dwa, err = b.faddr(op, "dw", dw); err != nil {
			return err
		}
	}
	if vec8(int64(h), dxa, dya, xa, wa) && int64(h)/8 <= 2*maxRowBlock {
		return b.rmsnormBackward8(dx, dw, dy, x, w, dxa, dwa, dya, xa, wa, ra, int64(t), int64(h), fusedAdd{})
	}
	var ls []launch
	if withDW {
		// dw first: dx may overwrite dy.
		ls = append(ls, cols32("k_rmsnorm_dw", int64(h), new(kargs).u64(dwa).dt(dw.DType).u64(dya).dt(dy.DType).
			u64(xa).dt(x.DType).u64(ra).i64(int64(t)).i64(int64(h))))
	}
	ls = append(ls, rows1("k_rmsnorm_bwd", int64(t), new(kargs).u64(dxa).dt(dx.DType).u64(dya).dt(dy.DType).
		u64(xa).dt(x.DType).u64(wa).dt(w.DType).u64(ra).i64(int64(t)).i64(int64(h))))
	return b.issue(ls...)
}

// AddBias adds b [N] to every row of y [T,N].
func (b *Backend) AddBias(y, bias gpu.Tensor) error {
	const op = "addbias"
	t, n, err := gpu.BiasDims(op, false, y, bias)
	if err != nil {
		return err
	}
	ya, err := b.faddr(op, "y", y)
	if err != nil {
		return err
	}
	ba, err := b.faddr(op, "b", bias)
	if err != nil {
		return err
	}
	args := new(kargs).u64(ya).dt(y.DType).u64(ba).dt(bias.DType).i64(int64(t)).i64(int64(n))
	if vec8(int64(n), ya, ba) {
		return b.issue(b.flat8("k_addbias", int64(t)*int64(n), args))
	}
	return b.issue(b.flat1("k_addbias", int64(t)*int64(n), args))
}

// BiasGrad accumulates the column sums of dy [T,N] into db [N].
func (b *Backend) BiasGrad(db, dy gpu.Tensor) error {
	const op = "biasgrad"
	t, n, err := gpu.BiasDims(op, true, dy, db)
	if err != nil {
		return err
	}
	dba, err := b.faddr(op, "db", db)
	if err != nil {
		return err
	}
	dya, err := b.faddr(op, "dy", dy)
	if err != nil {
		return err
	}
	if t > 0 && vec8(int64(n), dya) {
		return b.biasGrad8(db, dy, dba, dya, int64(t), int64(n))
	}
	return b.issue(cols32("k_colsum", int64(n), new(kargs).u64(dba).dt(db.DType).u64(dya).dt(dy.DType).i64(int64(t)).i64(int64(n))))
}

// biasGrad8 is BiasGrad through k_colsum8_part, blocks of 256 columns by
// runs of rows, about four blocks per SM, each writing float64 column sums
// into the stream's scratch, and k_rmsnorm_dw_reduce, which adds them in a
// fixed order into db.
func (b *Backend) biasGrad8(db, dy gpu.Tensor, dba, dya uint64, t, n int64) error {
	s, err := b.stream()
	if err != nil {
		return err
	}
	tiles := (n/8 + 31) / 32
	blocks := max(int64(max(b.d.info.SMs, 1))*4/tiles, 1)
	blocks = min(blocks, scratchUsable/(8*n), (t+31)/32)
	blocks = max(blocks, 1)
	rpb := (t + blocks - 1) / blocks
	blocks = (t + rpb - 1) / rpb
	part := uint64(s.scratch)
	return b.issue(
		launch{name: "k_colsum8_part", gx: uint32(tiles), gy: uint32(blocks), gz: 1, bx: 32, by: 8, bz: 1,
			args: new(kargs).u64(part).u64(dya).dt(dy.DType).i64(t).i64(n).i64(rpb)},
		cols32("k_rmsnorm_dw_reduce", n, new(kargs).u64(dba).dt(db.DType).u64(part).i64(blocks).i64(n)))
}

// RoPE rotates x in place (HF rotate-half convention and roundings).
func (b *Backend) RoPE(x, pos gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) error {
	return b.rope("rope", x, pos, theta, scaling, false)
}

// RoPEBackward rotates dx in place by the negative angle.
func (b *Backend) RoPEBackward(dx, pos gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) error {
	return b.rope("rope backward", dx, pos, theta, scaling, true)
}

// maxRoPEHalf is the size of the inverse-frequency table passed by value.
const maxRoPEHalf = 256

// rope computes the inverse frequencies on the host with gpu.RoPEInvFreq
// (HF's float32 order, llama3 and linear scaling included) and passes them
// by value in the kernel parameters (1 KiB), so no device table is needed.
func (b *Backend) rope(op string, x, pos gpu.Tensor, theta float64, scaling *gpu.RoPEScaling, backward bool) error {
	if err := rank(op, "x", x, 3); err != nil {
		return err
	}
	t, heads, d := x.Shape[0], x.Shape[1], x.Shape[2]
	if err := need(op, "pos", pos, t); err != nil {
		return err
	}
	if err := noAlias(op, "x", "pos", x, pos); err != nil {
		return err
	}
	tbl, err := ropeTable(op, d, theta, scaling)
	if err != nil {
		return err
	}
	xa, err := b.faddr(op, "x", x)
	if err != nil {
		return err
	}
	pa, err := b.taddr(op, "pos", pos, gpu.I32)
	if err != nil {
		return err
	}
	args := new(kargs).u64(xa).dt(x.DType).u64(pa).i64(int64(t)).i32(heads).i32(d).put(tbl).i32(b2i(backward))
	if d%16 == 0 && vec8(8, xa) && t > 0 && heads > 0 {
		tb := ropeTokens(heads, d)
		return b.issue(launch{name: "k_rope8", gx: rowGrid((int64(t) + int64(tb) - 1) / int64(tb)), gy: 1, gz: 1, bx: 256, by: 1, bz: 1,
			smem: 2 * tb * (d / 2) * 4, args: args.i32(tb)})
	}
	return b.issue(launch{name: "k_rope", gx: rowGrid(int64(t)), gy: 1, gz: 1, bx: 128, by: 1, bz: 1, args: args})
}

// ropeTable returns the InvFreq kernel parameter of head dim d: the
// inverse frequencies (gpu.RoPEInvFreq) as float32 bytes, zero-padded.
func ropeTable(op string, d int, theta float64, scaling *gpu.RoPEScaling) ([]byte, error) {
	inv, err := gpu.RoPEInvFreq(d, theta, scaling)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if len(inv) > maxRoPEHalf {
		return nil, fmt.Errorf("%s: head dim %d exceeds %d", op, d, 2*maxRoPEHalf)
	}
	tbl := make([]byte, 4*maxRoPEHalf)
	for i, f := range inv {
		u := math.Float32bits(f)
		tbl[4*i], tbl[4*i+1], tbl[4*i+2], tbl[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	}
	return tbl, nil
}

// ropeTokens is the tokens a k_rope8 block takes: enough for about 1024
// groups of 8 pairs (four per thread), at most 16, and few enough that
// their cos and sin (d/2 each a token) stay within 4096 entries each; the
// block's dynamic shared memory holds exactly its tb tokens' tables.
func ropeTokens(heads, d int) int {
	per := heads * d / 16
	return max(min((1024+per-1)/per, 16, 4096/(d/2)), 1)
}

// SwiGLU computes out = silu(gate)*up.
func (b *Backend) SwiGLU(out, gate, up gpu.Tensor) error {
	const op = "swiglu"
	as, err := b.elem(op, arg("out", out), arg("gate", gate), arg("up", up))
	if err != nil {
		return err
	}
	if err := gpu.CheckSwiGLU(op, out, gate, up); err != nil {
		return err
	}
	n := int64(out.Numel())
	return b.issue(b.flat("k_swiglu", n, as, new(kargs).u64(as[0]).dt(out.DType).u64(as[1]).dt(gate.DType).u64(as[2]).dt(up.DType).i64(n)))
}

// SwiGLUBackward computes dGate and dUp.
func (b *Backend) SwiGLUBackward(dGate, dUp, dOut, gate, up gpu.Tensor) error {
	const op = "swiglu backward"
	as, err := b.elem(op, arg("dGate", dGate), arg("dUp", dUp), arg("dOut", dOut), arg("gate", gate), arg("up", up))
	if err != nil {
		return err
	}
	if err := gpu.CheckSwiGLUBackward(op, dGate, dUp, dOut, gate, up); err != nil {
		return err
	}
	n := int64(dGate.Numel())
	return b.issue(b.flat("k_swiglu_bwd", n, as, new(kargs).u64(as[0]).dt(dGate.DType).u64(as[1]).dt(dUp.DType).
		u64(as[2]).dt(dOut.DType).u64(as[3]).dt(gate.DType).u64(as[4]).dt(up.DType).i64(n)))
}

// Add computes dst = a + b.
func (b *Backend) Add(dst, x, y gpu.Tensor) error {
	const op = "add"
	as, err := b.elem(op, arg("dst", dst), arg("a", x), arg("b", y))
	if err != nil {
		return err
	}
	if err := aliasOK(op, "dst", "a", dst, x); err != nil {
		return err
	}
	if err := aliasOK(op, "dst", "b", dst, y); err != nil {
		return err
	}
	n := int64(dst.Numel())
	return b.issue(b.flat("k_add", n, as, new(kargs).u64(as[0]).dt(dst.DType).u64(as[1]).dt(x.DType).u64(as[2]).dt(y.DType).i64(n)))
}

// Scale computes x *= s.
func (b *Backend) Scale(x gpu.Tensor, s float32) error {
	as, err := b.elem("scale", arg("x", x))
	if err != nil {
		return err
	}
	n := int64(x.Numel())
	return b.issue(b.flat("k_scale", n, as, new(kargs).u64(as[0]).dt(x.DType).i64(n).f32(s)))
}

// AddScaled computes dst += s*x.
func (b *Backend) AddScaled(dst, x gpu.Tensor, s float32) error {
	const op = "addscaled"
	as, err := b.elem(op, arg("dst", dst), arg("x", x))
	if err != nil {
		return err
	}
	if err := aliasOK(op, "dst", "x", dst, x); err != nil {
		return err
	}
	n := int64(dst.Numel())
	return b.issue(b.flat("k_addscaled", n, as, new(kargs).u64(as[0]).dt(dst.DType).u64(as[1]).dt(x.DType).i64(n).f32(s)))
}

// AdamW performs one torch.optim.AdamW step with the CPU backend's float32
// operation order.
func (b *Backend) AdamW(p, g, m, v gpu.Tensor, st gpu.AdamWStep) error {
	const op = "adamw"
	if err := gpu.CheckAdamW(op, p, g, m, v); err != nil {
		return err
	}
	as, err := b.elem(op, arg("p", p), arg("g", g), arg("m", m), arg("v", v))
	if err != nil {
		return err
	}
	if err := st.Check(op); err != nil {
		return err
	}
	lr, beta1, beta2, eps, weightDecay, step := st.LR, st.Beta1, st.Beta2, st.Eps, st.WeightDecay, st.Step
	decay := float32(1 - lr*weightDecay)
	w1 := float32(1 - beta1)
	b2 := float32(beta2)
	w2 := float32(1 - beta2)
	bc1 := 1 - math.Pow(beta1, float64(step))
	bc2 := 1 - math.Pow(beta2, float64(step))
	stepSize := float32(-(lr / bc1))
	bc2sqrt := float32(math.Sqrt(bc2))
	n := int64(p.Numel())
	name, units := adamwKernel(n, g.DType, as...)
	return b.issue(b.flat1(name, units, new(kargs).u64(as[0]).u64(as[1]).dt(g.DType).u64(as[2]).u64(as[3]).i64(units).
		f32(decay).f32(w1).f32(b2).f32(w2).f32(stepSize).f32(bc2sqrt).f32(float32(eps)).f32(st.Scale())))
}

// adamwKernel names AdamW's kernel for n elements, grads of dtype gd, at
// addresses as (p, g, m, v), and the units its launch covers: when n is a
// multiple of 4 and p, m and v are 16-byte aligned, k_adamw4 (float4s)
// for float32 grads also 16-byte aligned, k_adamw4_16 for 16-bit grads
// 8-byte aligned; otherwise k_adamw.
func adamwKernel(n int64, gd gpu.DType, as ...uint64) (string, int64) {
	if n%4 == 0 && aligned16(as[0], as[2], as[3]) {
		switch {
		case gd == gpu.F32 && aligned16(as[1]):
			return "k_adamw4", n / 4
		case gd != gpu.F32 && as[1]%8 == 0:
			return "k_adamw4_16", n / 4
		}
	}
	return "k_adamw", n
}

// sumSquaresKernel names SumSquares' kernel for n elements at address a
// and its grid (at most sumPartials blocks): k_sumsq8 (16-byte loads, two
// groups a thread a turn) when a is 16-byte aligned, else k_sumsq.
func (d *device) sumSquaresKernel(n int64, a uint64) (string, uint32) {
	if aligned16(a) {
		return "k_sumsq8", max(min(d.gridFor((n+15)/16), sumPartials), 1)
	}
	return "k_sumsq", max(min(d.gridFor(n), sumPartials), 1)
}

// SumSquares returns Σ x² in float64: fixed-grid per-block float64 partial
// sums into the stream's scratch, one block adding them in a fixed order,
// then an 8-byte download (so it waits for the stream).
func (b *Backend) SumSquares(x gpu.Tensor) (float64, error) {
	var out [8]byte
	err := b.sumSquares(x, 0, func(s *Stream, res uint64) error {
		if err := cuErr("cuMemcpyDtoHAsync", C.cuMemcpyDtoHAsync_(unsafe.Pointer(&out[0]), C.CUdeviceptr(res), 8, C.uint64_t(s.h))); err != nil {
			return err
		}
		return cuErr("cuStreamSynchronize", C.cuStreamSynchronize_(s.h))
	})
	if err != nil {
		return 0, err
	}
	var u uint64
	for i := range out {
		u |= uint64(out[i]) << (8 * i)
	}
	return math.Float64frombits(u), nil
}

// SumSquaresTo has the kernels of SumSquares write Σ x² into dst's 8 bytes
// (8-byte aligned), without waiting.
func (b *Backend) SumSquaresTo(dst, x gpu.Tensor) error {
	a, err := b.addr("sumsquares", "dst", dst)
	if err != nil {
		return err
	}
	if dst.Bytes() != 8 || a%8 != 0 {
		return fmt.Errorf("sumsquares: dst has %d bytes at offset %d mod 8, want 8 aligned", dst.Bytes(), a%8)
	}
	return b.sumSquares(x, a, nil)
}

// sumSquares launches SumSquares' kernels for x, the result going to
// device address res (0: the stream's scratch), and then calls then (when
// not nil) with the stream and the result's address, within one device
// turn. An empty x writes 0.
func (b *Backend) sumSquares(x gpu.Tensor, res uint64, then func(s *Stream, res uint64) error) error {
	as, err := b.elem("sumsquares", arg("x", x))
	if err != nil {
		return err
	}
	s, err := b.stream()
	if err != nil {
		return err
	}
	n := int64(x.Numel())
	name, grid := b.d.sumSquaresKernel(n, as[0])
	part := uint64(s.scratch)
	if res == 0 {
		res = part + 8*sumPartials
	}
	return b.d.do(func() error {
		ls := []launch{{name: "k_sum_partials", gx: 1, gy: 1, gz: 1, bx: 256, by: 1, bz: 1, args: new(kargs).u64(part).i32(int(grid)).u64(res)}}
		if n > 0 {
			ls = append([]launch{{name: name, gx: grid, gy: 1, gz: 1, bx: 256, by: 1, bz: 1, args: new(kargs).u64(as[0]).dt(x.DType).i64(n).u64(part)}}, ls...)
		} else {
			ls[0].args = new(kargs).u64(part).i32(0).u64(res)
		}
		if err := b.d.run(s, ls...); err != nil {
			return err
		}
		if then != nil {
			return then(s, res)
		}
		return nil
	})
}

// normRowKernel names the warp-per-row RMSNorm forward kernel
// (k_rmsnorm_r<G>_<dtype>, G the column groups a lane holds) for rows of h
// values of dtype xd into dtype dd with weights of dtype wd: where x is f32,
// dst and w are both bf16 (or both f16), and the row has 33 to 512 groups
// of 8, unless RLPIPE_CUDA_NORM_WARP=0. The caller has checked vec8.
func normRowKernel(h int64, xd, dd, wd gpu.DType) (string, bool) {
	ng := h / 8
	if normWarpOff || ng <= warpGroups || ng > 16*32 || xd != gpu.F32 || dd != wd || (dd != gpu.BF16 && dd != gpu.F16) {
		return "", false
	}
	g := 2
	switch {
	case ng <= 4*32:
		g = 0
	case ng <= 8*32:
		g = 1
	}
	return normRowKernels[b2i(dd == gpu.F16)][g], true
}

// normRowKernels are the warp-per-row forwards' names by dtype (bf16, f16)
// and the groups a lane holds (4, 8, 16).
var normRowKernels = [2][3]string{
	{"k_rmsnorm_r4_bf16", "k_rmsnorm_r8_bf16", "k_rmsnorm_r16_bf16"},
	{"k_rmsnorm_r4_f16", "k_rmsnorm_r8_f16", "k_rmsnorm_r16_f16"},
}

// normWarpOff turns the warp-per-row RMSNorm forward off
// (RLPIPE_CUDA_NORM_WARP=0), for comparing it with k_rmsnorm8 in one
// binary.
var normWarpOff = os.Getenv("RLPIPE_CUDA_NORM_WARP") == "0"

// warpGroups is the most 8-column groups a row may have for the
// warp-per-row RMSNorm kernels (*_w): h <= 256.
const warpGroups = 32

// maxRowBlock is the largest block the *8 row kernels use for one row's
// column groups (k_rmsnorm_bwd8_* are compiled for at most 512 threads).
const maxRowBlock = 512

// groupBlock returns a block size for ng column groups: a multiple of 32,
// at least 32 and at most limit, covering ng in one pass when it can.
func groupBlock(ng int64, limit int64) uint32 {
	n := min(max((ng+31)/32*32, 32), limit)
	return uint32(n)
}

// rmsnormBackward8 is RMSNormBackward through k_rmsnorm_bwd8_K: each block
// takes a contiguous run of rows, computes their dx and, with dw, its own
// float64 column sums into the stream's scratch; k_rmsnorm_dw_reduce then
// adds the blocks' sums in a fixed order. Threads own K = 1 or 2 groups of
// 8 columns, so h/8 may be up to 2*maxRowBlock; rows of at most warpGroups
// groups take k_rmsnorm_bwd8_w, a warp per row.
// fusedAdd, when acc is not 0, makes k_rmsnorm_bwd8_1a/2 add dx into the
// float32 acc (and store it again in cast, dtype ct, when cast is not 0)
// instead of writing it (RMSNormBackwardAdd); k_rmsnorm_bwd8_1a is
// k_rmsnorm_bwd8_1 with each next row's loads issued ahead.
type fusedAdd struct {
	acc, cast uint64
	ct        gpu.DType
}

func (b *Backend) rmsnormBackward8(dx, dw, dy, x, w gpu.Tensor, dxa, dwa, dya, xa, wa, ra uint64, t, h int64, fa fusedAdd) error {
	s, err := b.stream()
	if err != nil {
		return err
	}
	if t == 0 || h == 0 {
		return nil
	}
	ng := h / 8
	k := int64(1)
	if ng > maxRowBlock {
		k = 2
	}
	bx := groupBlock((ng+k-1)/k, maxRowBlock)
	name := fmt.Sprintf("k_rmsnorm_bwd8_%d", k)
	if k == 1 && fa.acc != 0 {
		name += "a" // the next row's loads ahead
	}
	if ng <= warpGroups {
		name, bx = "k_rmsnorm_bwd8_w", 256
	}
	// One wave: as many blocks as the SMs hold at once (fewer where the
	// scratch caps them), each a run of rows. With four an SM, capped
	// by the scratch, the fused add at 16384 rows of 1536 took 335
	// blocks where 264 fit (two an SM): a second, partial wave, 29%
	// slower (BenchmarkOps on an H200, docs/performance.md).
	occ, err := b.d.resident(name, bx)
	if err != nil {
		return err
	}
	blocks := int64(max(b.d.info.SMs, 1)) * int64(occ)
	var part uint64
	if dw.Mem != nil {
		// One float64 row of h partial sums per block must fit the scratch.
		blocks = min(blocks, scratchUsable/(8*h))
		part = uint64(s.scratch)
	}
	blocks = max(min(blocks, t), 1)
	rpb := (t + blocks - 1) / blocks
	blocks = (t + rpb - 1) / rpb
	args := new(kargs).u64(dxa).dt(dx.DType).u64(dya).dt(dy.DType).u64(xa).dt(x.DType).u64(wa).dt(w.DType).u64(ra).
		i64(t).i64(h).i64(rpb).u64(part)
	if ng > warpGroups {
		args = args.u64(fa.acc).u64(fa.cast).dt(fa.ct)
	}
	ls := []launch{{name: name, gx: uint32(blocks), gy: 1, gz: 1, bx: bx, by: 1, bz: 1, args: args}}
	if dw.Mem != nil {
		ls = append(ls, cols32("k_rmsnorm_dw_reduce", h, new(kargs).u64(dwa).dt(dw.DType).u64(part).i64(blocks).i64(h)))
	}
	return b.issue(ls...)
}

// AddRMSNorm writes sum = a + b and normalises it: one pass of
// k_add_rmsnorm8 for rows of more than 256 values at 16-byte aligned
// addresses (the shapes k_rmsnorm8 takes), otherwise the two steps
// (gpu.AddRMSNormSteps); the values are the same.
func (b *Backend) AddRMSNorm(sum, dst, rstd, x, y, w gpu.Tensor, eps float32) error {
	const op = "add rmsnorm"
	t, h, err := gpu.AddRMSNormDims(op, sum, dst, rstd, x, y, w, eps)
	if err != nil {
		return err
	}
	var as [5]uint64
	for i, n := range []named{arg("sum", sum), arg("dst", dst), arg("a", x), arg("b", y), arg("w", w)} {
		if as[i], err = b.faddr(op, n.Name, n.T); err != nil {
			return err
		}
	}
	ra, err := b.taddr(op, "rstd", rstd, gpu.F32)
	if err != nil {
		return err
	}
	if !vec8(int64(h), as[:]...) || int64(h)/8 <= warpGroups {
		return gpu.AddRMSNormSteps(b, sum, dst, rstd, x, y, w, eps)
	}
	if t == 0 {
		return nil
	}
	return b.issue(launch{name: "k_add_rmsnorm8", gx: rowGrid(int64(t)), gy: 1, gz: 1, bx: groupBlock(int64(h)/8, 1024), by: 1, bz: 1,
		args: new(kargs).u64(as[0]).dt(sum.DType).u64(as[1]).dt(dst.DType).u64(ra).u64(as[2]).dt(x.DType).u64(as[3]).dt(y.DType).
			u64(as[4]).dt(w.DType).i64(int64(t)).i64(int64(h)).f32(eps)})
}

// RMSNormBackwardAdd adds the norm's dx into acc (and casts acc into cast):
// one pass of k_rmsnorm_bwd8_1/2 for a float32 acc and rows of more than
// 256 values at 16-byte aligned addresses (the shapes those kernels take),
// otherwise the steps (gpu.RMSNormBackwardAddSteps); the values are the
// same.
func (b *Backend) RMSNormBackwardAdd(acc, cast, dw, dy, x, w, rstd gpu.Tensor) error {
	const op = "rmsnorm backward add"
	t, h, err := gpu.RMSNormBackwardAddDims(op, acc, cast, dw, dy, x, w, rstd)
	if err != nil {
		return err
	}
	ns := []named{arg("acc", acc), arg("dy", dy), arg("x", x), arg("w", w)}
	if cast.Mem != nil {
		ns = append(ns, arg("cast", cast))
	}
	as := make([]uint64, len(ns))
	for i, n := range ns {
		if as[i], err = b.faddr(op, n.Name, n.T); err != nil {
			return err
		}
	}
	ra, err := b.taddr(op, "rstd", rstd, gpu.F32)
	if err != nil {
		return err
	}
	var dwa uint64
	if dw.Mem != nil {
		if dwa, err = b.faddr(op, "dw", dw); err != nil {
			return err
		}
	}
	if acc.DType != gpu.F32 || !vec8(int64(h), as...) || int64(h)/8 <= warpGroups || int64(h)/8 > 2*maxRowBlock {
		return gpu.RMSNormBackwardAddSteps(b, acc, cast, dw, dy, x, w, rstd)
	}
	fa := fusedAdd{acc: as[0], ct: dy.DType}
	if cast.Mem != nil {
		fa.cast, fa.ct = as[4], cast.DType
	}
	return b.rmsnormBackward8(dy, dw, dy, x, w, as[1], dwa, as[1], as[2], as[3], ra, int64(t), int64(h), fa)
}
