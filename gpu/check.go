package gpu

import (
	"fmt"
	"math"
)

// The argument checks of the Backend contract, shared by every
// implementation so that all backends accept and refuse the same calls with
// the same messages. op names the operation in errors.

// CheckShape returns an error unless t is present and has exactly the shape want.
func CheckShape(op, name string, t Tensor, want ...int) error {
	if t.Mem == nil {
		return fmt.Errorf("%s: %s is missing", op, name)
	}
	if !SameShape(t.Shape, want) {
		return fmt.Errorf("%s: %s has shape %v, want %v", op, name, t.Shape, want)
	}
	return nil
}

// CheckRank returns an error unless t is present and has r dimensions.
func CheckRank(op, name string, t Tensor, r int) error {
	if t.Mem == nil {
		return fmt.Errorf("%s: %s is missing", op, name)
	}
	if len(t.Shape) != r {
		return fmt.Errorf("%s: %s must have %d dimensions, has shape %v", op, name, r, t.Shape)
	}
	return nil
}

// Overlap reports whether a and b share bytes of the same memory.
func Overlap(a, b Tensor) bool {
	if a.Mem == nil || b.Mem == nil || a.Mem != b.Mem {
		return false
	}
	return a.Off < b.Off+b.Bytes() && b.Off < a.Off+a.Bytes()
}

// SameView reports whether a and b are the same view.
func SameView(a, b Tensor) bool {
	return a.Mem == b.Mem && a.Off == b.Off && a.DType == b.DType && a.Numel() == b.Numel()
}

// CheckAlias rejects an output that partially overlaps an input; the same
// view (an in-place op) is allowed.
func CheckAlias(op, outName, inName string, out, in Tensor) error {
	if Overlap(out, in) && !SameView(out, in) {
		return fmt.Errorf("%s: %s partially overlaps %s", op, outName, inName)
	}
	return nil
}

// CheckNoAlias rejects an output that overlaps an input at all.
func CheckNoAlias(op, outName, inName string, out, in Tensor) error {
	if Overlap(out, in) {
		return fmt.Errorf("%s: %s must not overlap %s", op, outName, inName)
	}
	return nil
}

// GemmDims checks the operands of Gemm (2-D c, a and b, op(a) [M,K] times
// op(b) [K,N] into c [M,N], c overlapping neither input) and returns M, N, K.
func GemmDims(c, a, b Tensor, transA, transB bool) (m, n, k int, err error) {
	const op = "gemm"
	for _, x := range []struct {
		n string
		t Tensor
	}{{"c", c}, {"a", a}, {"b", b}} {
		if err := CheckRank(op, x.n, x.t, 2); err != nil {
			return 0, 0, 0, err
		}
	}
	m, k = a.Shape[0], a.Shape[1]
	if transA {
		m, k = k, m
	}
	k2, n := b.Shape[0], b.Shape[1]
	if transB {
		k2, n = n, k2
	}
	if k != k2 {
		return 0, 0, 0, fmt.Errorf("gemm: inner dimensions differ: op(a) is [%d %d], op(b) is [%d %d]", m, k, k2, n)
	}
	if err := CheckShape(op, "c", c, m, n); err != nil {
		return 0, 0, 0, err
	}
	if err := CheckNoAlias(op, "c", "a", c, a); err != nil {
		return 0, 0, 0, err
	}
	if err := CheckNoAlias(op, "c", "b", c, b); err != nil {
		return 0, 0, 0, err
	}
	return m, n, k, nil
}

// LogProbsDims checks the operands shared by LogProbs and LogProbsBackward
// (h [C,H], w [V,H], targets [C], logits workspace [C,V] overlapping no
// input, entropy [C] or absent, a positive finite temperature) and returns
// C, H, V and whether an entropy is asked for.
func LogProbsDims(op string, entropy, h, w, targets Tensor, temperature float32, logits Tensor) (c, hd, v int, hasEntropy bool, err error) {
	if err := CheckRank(op, "h", h, 2); err != nil {
		return 0, 0, 0, false, err
	}
	if err := CheckRank(op, "w", w, 2); err != nil {
		return 0, 0, 0, false, err
	}
	c, hd, v = h.Shape[0], h.Shape[1], w.Shape[0]
	if err := CheckShape(op, "w", w, v, hd); err != nil {
		return 0, 0, 0, false, err
	}
	if err := CheckShape(op, "targets", targets, c); err != nil {
		return 0, 0, 0, false, err
	}
	if err := CheckShape(op, "logits", logits, c, v); err != nil {
		return 0, 0, 0, false, err
	}
	hasEntropy = !entropy.Empty()
	if hasEntropy {
		if err := CheckShape(op, "entropy", entropy, c); err != nil {
			return 0, 0, 0, false, err
		}
	}
	if !(temperature > 0) || math.IsInf(float64(temperature), 0) {
		return 0, 0, 0, false, fmt.Errorf("%s: temperature %v must be positive and finite", op, temperature)
	}
	for _, in := range []struct {
		n string
		t Tensor
	}{{"h", h}, {"w", w}, {"targets", targets}, {"entropy", entropy}} {
		if err := CheckNoAlias(op, "logits", in.n, logits, in.t); err != nil {
			return 0, 0, 0, false, err
		}
	}
	return c, hd, v, hasEntropy, nil
}
