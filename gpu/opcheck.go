package gpu

import (
	"fmt"
	"math"
)

// The operand checks of single ops, shared by every backend so that they
// accept and refuse the same calls with the same messages. Each returns the
// op's dimensions; what a backend must check on its own (dtypes it supports,
// the memory an operand lives in, the contents of index tensors) stays with
// it.

// Named is an operand with its name, for error messages.
type Named struct {
	Name string
	T    Tensor
}

// Arg names an operand: Arg("x", x).
func Arg(name string, t Tensor) Named { return Named{name, t} }

// CheckNoAliasAll rejects out overlapping any of ins.
func CheckNoAliasAll(op, outName string, out Tensor, ins ...Named) error {
	for _, in := range ins {
		if err := CheckNoAlias(op, outName, in.Name, out, in.T); err != nil {
			return err
		}
	}
	return nil
}

// EmbeddingDims checks the operands of Embedding (backward false: rows is
// dst, written from table) and EmbeddingBackward (backward true: table is
// dTable, accumulated from rows = dY): table [V,H], ids [T], rows [T,H], the
// output overlapping neither input. It returns V, H and T.
func EmbeddingDims(op string, backward bool, table, rows, ids Tensor) (v, h, t int, err error) {
	tn, rn := "table", "dst"
	if backward {
		tn, rn = "dTable", "dY"
	}
	if err := CheckRank(op, tn, table, 2); err != nil {
		return 0, 0, 0, err
	}
	if err := CheckRank(op, "ids", ids, 1); err != nil {
		return 0, 0, 0, err
	}
	v, h, t = table.Shape[0], table.Shape[1], ids.Shape[0]
	if err := CheckShape(op, rn, rows, t, h); err != nil {
		return 0, 0, 0, err
	}
	out, in := Named{rn, rows}, Named{tn, table}
	if backward {
		out, in = in, out
	}
	if err := CheckNoAliasAll(op, out.Name, out.T, in, Named{"ids", ids}); err != nil {
		return 0, 0, 0, err
	}
	return v, h, t, nil
}

// CopyRowsDims checks CopyRows' operands: dst and src [V,H] of one dtype,
// not overlapping, rows I32 [R] overlapping neither. It returns V, H and R.
func CopyRowsDims(op string, dst, src, rows Tensor) (v, h, r int, err error) {
	if err := CheckRank(op, "src", src, 2); err != nil {
		return 0, 0, 0, err
	}
	if err := CheckRank(op, "rows", rows, 1); err != nil {
		return 0, 0, 0, err
	}
	v, h, r = src.Shape[0], src.Shape[1], rows.Shape[0]
	if err := CheckShape(op, "dst", dst, v, h); err != nil {
		return 0, 0, 0, err
	}
	if dst.DType != src.DType {
		return 0, 0, 0, fmt.Errorf("%s: dst is %v, src %v", op, dst.DType, src.DType)
	}
	if rows.DType != I32 {
		return 0, 0, 0, fmt.Errorf("%s: rows must be %v, got %v", op, I32, rows.DType)
	}
	if err := CheckNoAliasAll(op, "dst", dst, Named{"src", src}, Named{"rows", rows}); err != nil {
		return 0, 0, 0, err
	}
	return v, h, r, nil
}

// RMSNormDims checks RMSNorm's operands: x [T,H], dst [T,H] (may be x),
// rstd [T], w [H], eps >= 0; rstd overlaps nothing, dst not w. It returns T
// and H.
func RMSNormDims(op string, dst, rstd, x, w Tensor, eps float32) (t, h int, err error) {
	if err := CheckRank(op, "x", x, 2); err != nil {
		return 0, 0, err
	}
	t, h = x.Shape[0], x.Shape[1]
	for _, c := range []struct {
		n string
		t Tensor
		s []int
	}{{"dst", dst, []int{t, h}}, {"rstd", rstd, []int{t}}, {"w", w, []int{h}}} {
		if err := CheckShape(op, c.n, c.t, c.s...); err != nil {
			return 0, 0, err
		}
	}
	if err := CheckAlias(op, "dst", "x", dst, x); err != nil {
		return 0, 0, err
	}
	if err := CheckNoAliasAll(op, "rstd", rstd, Named{"x", x}, Named{"w", w}, Named{"dst", dst}); err != nil {
		return 0, 0, err
	}
	if err := CheckNoAlias(op, "dst", "w", dst, w); err != nil {
		return 0, 0, err
	}
	if !(eps >= 0) {
		return 0, 0, fmt.Errorf("%s: eps %v must be non-negative", op, eps)
	}
	return t, h, nil
}

// RMSNormBackwardDims checks RMSNormBackward's operands: x, dy and dx
// [T,H] (dx may be dy), w [H], rstd [T], and dw [H] unless it is absent
// (Mem nil); outputs overlap no other operand. It returns T and H.
func RMSNormBackwardDims(op string, dx, dw, dy, x, w, rstd Tensor) (t, h int, err error) {
	if err := CheckRank(op, "x", x, 2); err != nil {
		return 0, 0, err
	}
	t, h = x.Shape[0], x.Shape[1]
	for _, c := range []struct {
		n string
		t Tensor
		s []int
	}{{"dx", dx, []int{t, h}}, {"dy", dy, []int{t, h}}, {"w", w, []int{h}}, {"rstd", rstd, []int{t}}} {
		if err := CheckShape(op, c.n, c.t, c.s...); err != nil {
			return 0, 0, err
		}
	}
	if dw.Mem != nil {
		if err := CheckShape(op, "dw", dw, h); err != nil {
			return 0, 0, err
		}
		if err := CheckNoAliasAll(op, "dw", dw, Named{"dx", dx}, Named{"dy", dy}, Named{"x", x}, Named{"w", w}, Named{"rstd", rstd}); err != nil {
			return 0, 0, err
		}
	}
	if err := CheckAlias(op, "dx", "dy", dx, dy); err != nil {
		return 0, 0, err
	}
	if err := CheckNoAliasAll(op, "dx", dx, Named{"x", x}, Named{"w", w}, Named{"rstd", rstd}); err != nil {
		return 0, 0, err
	}
	return t, h, nil
}

// CheckSwiGLU checks the aliasing of SwiGLU's operands (out may be gate or
// up); their shapes are the backends' elementwise checks.
func CheckSwiGLU(op string, out, gate, up Tensor) error {
	if err := CheckAlias(op, "out", "gate", out, gate); err != nil {
		return err
	}
	return CheckAlias(op, "out", "up", out, up)
}

// CheckSwiGLUBackward checks the aliasing of SwiGLUBackward's operands:
// dGate may be dOut; otherwise the outputs overlap nothing.
func CheckSwiGLUBackward(op string, dGate, dUp, dOut, gate, up Tensor) error {
	if err := CheckAlias(op, "dGate", "dOut", dGate, dOut); err != nil {
		return err
	}
	if err := CheckNoAliasAll(op, "dGate", dGate, Named{"gate", gate}, Named{"up", up}, Named{"dUp", dUp}); err != nil {
		return err
	}
	return CheckNoAliasAll(op, "dUp", dUp, Named{"dOut", dOut}, Named{"gate", gate}, Named{"up", up})
}

// AttentionDims checks the inputs of Attention and AttentionBackward: q
// [T,Hq,D], k and v [T,Hkv,D] with Hq a multiple of Hkv, cuSeqlens a vector,
// scale finite. It returns T, Hq, Hkv and D. The values in cuSeqlens are
// each backend's to check.
func AttentionDims(op string, q, k, v, cuSeqlens Tensor, scale float32) (t, hq, hkv, d int, err error) {
	if err := CheckRank(op, "q", q, 3); err != nil {
		return 0, 0, 0, 0, err
	}
	if err := CheckRank(op, "k", k, 3); err != nil {
		return 0, 0, 0, 0, err
	}
	t, hq, d = q.Shape[0], q.Shape[1], q.Shape[2]
	hkv = k.Shape[1]
	if hkv == 0 || hq%hkv != 0 {
		return 0, 0, 0, 0, fmt.Errorf("%s: %d query heads are not a multiple of %d kv heads", op, hq, hkv)
	}
	if err := CheckShape(op, "k", k, t, hkv, d); err != nil {
		return 0, 0, 0, 0, err
	}
	if err := CheckShape(op, "v", v, t, hkv, d); err != nil {
		return 0, 0, 0, 0, err
	}
	if err := CheckRank(op, "cuSeqlens", cuSeqlens, 1); err != nil {
		return 0, 0, 0, 0, err
	}
	if math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0) {
		return 0, 0, 0, 0, fmt.Errorf("%s: scale %v is not finite", op, scale)
	}
	return t, hq, hkv, d, nil
}

// CheckAttention checks Attention's outputs: out [T,Hq,D] and lse [Hq,T],
// overlapping no input and each other.
func CheckAttention(op string, out, lse, q, k, v, cuSeqlens Tensor, t, hq, d int) error {
	if err := CheckShape(op, "out", out, t, hq, d); err != nil {
		return err
	}
	if err := CheckShape(op, "lse", lse, hq, t); err != nil {
		return err
	}
	ins := []Named{{"q", q}, {"k", k}, {"v", v}, {"cuSeqlens", cuSeqlens}}
	if err := CheckNoAliasAll(op, "out", out, ins...); err != nil {
		return err
	}
	return CheckNoAliasAll(op, "lse", lse, append(ins, Named{"out", out})...)
}

// CheckAttentionBackward checks AttentionBackward's other operands: dq,
// dout and out [T,Hq,D], dk and dv [T,Hkv,D], lse [Hq,T]; the three
// outputs overlap no input and each other.
func CheckAttentionBackward(op string, dq, dk, dv, dout, out, lse, q, k, v, cuSeqlens Tensor, t, hq, hkv, d int) error {
	for _, c := range []struct {
		n    string
		t    Tensor
		h, d int
	}{{"dq", dq, hq, d}, {"dk", dk, hkv, d}, {"dv", dv, hkv, d}, {"dout", dout, hq, d}, {"out", out, hq, d}} {
		if err := CheckShape(op, c.n, c.t, t, c.h, c.d); err != nil {
			return err
		}
	}
	if err := CheckShape(op, "lse", lse, hq, t); err != nil {
		return err
	}
	outs := []Named{{"dq", dq}, {"dk", dk}, {"dv", dv}}
	ins := []Named{{"dout", dout}, {"out", out}, {"lse", lse}, {"q", q}, {"k", k}, {"v", v}, {"cuSeqlens", cuSeqlens}}
	for i, o := range outs {
		if err := CheckNoAliasAll(op, o.Name, o.T, append(ins, outs[:i]...)...); err != nil {
			return err
		}
	}
	return nil
}

// CheckLogProbs checks LogProbs' outputs, given LogProbsDims' c and
// hasEntropy: logp [c] overlapping no operand, and entropy (when present)
// overlapping no input.
func CheckLogProbs(op string, logp, entropy, h, w, targets, logits Tensor, c int, hasEntropy bool) error {
	if err := CheckShape(op, "logp", logp, c); err != nil {
		return err
	}
	ins := []Named{{"h", h}, {"w", w}, {"targets", targets}}
	if err := CheckNoAliasAll(op, "logp", logp, append(ins, Named{"logits", logits}, Named{"entropy", entropy})...); err != nil {
		return err
	}
	if !hasEntropy {
		return nil
	}
	return CheckNoAliasAll(op, "entropy", entropy, ins...)
}

// LogProbsStatsCols is the width of the row statistics workspace of
// LogProbs and LogitsBackward: F32 [C, LogProbsStatsCols], 32 bytes a row.
const LogProbsStatsCols = 8

// CheckLogProbsStats checks that workspace: absent (Mem nil), or F32
// [c, LogProbsStatsCols] and overlapping none of others.
func CheckLogProbsStats(op string, stats Tensor, c int, others ...Named) error {
	if stats.Mem == nil {
		return nil
	}
	if stats.DType != F32 {
		return fmt.Errorf("%s: stats is %v, want f32", op, stats.DType)
	}
	if err := CheckShape(op, "stats", stats, c, LogProbsStatsCols); err != nil {
		return err
	}
	return CheckNoAliasAll(op, "stats", stats, others...)
}

// CheckLogProbsBackward checks LogProbsBackward's other operands, given
// LogProbsDims' c, hd and v: dh [c,hd], dlogp [c], dw [v,hd] unless absent
// (Mem nil); the outputs overlap no other operand, and the logits workspace
// must not overlap dlogp.
func CheckLogProbsBackward(op string, dh, dw, dlogp, dentropy, h, w, targets, logits Tensor, c, hd, v int) error {
	if err := CheckShape(op, "dh", dh, c, hd); err != nil {
		return err
	}
	if err := CheckShape(op, "dlogp", dlogp, c); err != nil {
		return err
	}
	ins := []Named{{"h", h}, {"w", w}, {"targets", targets}, {"logits", logits}, {"dlogp", dlogp}, {"dentropy", dentropy}}
	if err := CheckNoAliasAll(op, "dh", dh, ins...); err != nil {
		return err
	}
	if dw.Mem != nil {
		if err := CheckShape(op, "dw", dw, v, hd); err != nil {
			return err
		}
		if err := CheckNoAliasAll(op, "dw", dw, append(ins, Named{"dh", dh})...); err != nil {
			return err
		}
	}
	return CheckNoAlias(op, "logits", "dlogp", logits, dlogp)
}

// BiasDims checks AddBias (grad false: y [T,N] += b [N]) and BiasGrad
// (grad true: db [N] += column sums of dy [T,N]): the matrix is 2-D, the
// vector its width, and they do not overlap. It returns T and N.
func BiasDims(op string, grad bool, mat, vec Tensor) (t, n int, err error) {
	mn, vn := "y", "b"
	if grad {
		mn, vn = "dy", "db"
	}
	if err := CheckRank(op, mn, mat, 2); err != nil {
		return 0, 0, err
	}
	t, n = mat.Shape[0], mat.Shape[1]
	if err := CheckShape(op, vn, vec, n); err != nil {
		return 0, 0, err
	}
	if grad {
		err = CheckNoAlias(op, vn, mn, vec, mat)
	} else {
		err = CheckNoAlias(op, mn, vn, mat, vec)
	}
	if err != nil {
		return 0, 0, err
	}
	return t, n, nil
}

// CheckAdamW checks that AdamW's p, m and v are F32, g F32, BF16 or F16,
// and the four pairwise disjoint; their shapes are the backends'
// elementwise checks.
func CheckAdamW(op string, p, g, m, v Tensor) error {
	ts := []Named{{"p", p}, {"g", g}, {"m", m}, {"v", v}}
	for i, t := range ts {
		grad16 := t.Name == "g" && (t.T.DType == BF16 || t.T.DType == F16) // read as float32
		if t.T.DType != F32 && !grad16 {
			return fmt.Errorf("%s: %s must be f32, got %v", op, t.Name, t.T.DType)
		}
		for _, u := range ts[:i] {
			if Overlap(t.T, u.T) {
				return fmt.Errorf("%s: %s overlaps %s", op, t.Name, u.Name)
			}
		}
	}
	return nil
}
