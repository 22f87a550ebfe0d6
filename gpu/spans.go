package gpu

import (
	"fmt"
	"math"
)

// SpanLayouts is how many span layouts a device backend may keep, each 8
// bytes per query row and per key row (the CUDA backend keeps them on the
// device; the plan reserves them). A micro-batch of a cp group uses cp−1
// layouts (one per other rank) in every layer, forward and backward, so up
// to cp 9 each is uploaded once per micro-batch.
const SpanLayouts = 8

// Span is one block of span attention (context parallelism's ring
// attention): query rows [Q, Q+QLen) attend every key row [K, K+KLen).
type Span struct{ Q, QLen, K, KLen int }

// SpanAttentionDims checks the operands of span attention and returns
// their dimensions: q [Tq,Hq,D], k and v [Tk,Hkv,D] of one dtype, Hq a
// multiple of Hkv, a positive finite scale, and spans inside the rows that
// share no query and no key row.
func SpanAttentionDims(op string, q, k, v Tensor, spans []Span, scale float32) (tq, tk, hq, hkv, d int, err error) {
	if q.DType != k.DType || q.DType != v.DType {
		return 0, 0, 0, 0, 0, fmt.Errorf("%s: q, k and v dtypes differ: %v, %v, %v", op, q.DType, k.DType, v.DType)
	}
	if len(q.Shape) != 3 || len(k.Shape) != 3 || !SameShape(k.Shape, v.Shape) {
		return 0, 0, 0, 0, 0, fmt.Errorf("%s: want q [Tq,Hq,D] and k, v [Tk,Hkv,D], got %v, %v, %v", op, q.Shape, k.Shape, v.Shape)
	}
	tq, hq, d = q.Shape[0], q.Shape[1], q.Shape[2]
	tk, hkv = k.Shape[0], k.Shape[1]
	if k.Shape[2] != d || hkv == 0 || hq%hkv != 0 {
		return 0, 0, 0, 0, 0, fmt.Errorf("%s: heads or head dims do not match: q %v, k %v", op, q.Shape, k.Shape)
	}
	if scale <= 0 || math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0) {
		return 0, 0, 0, 0, 0, fmt.Errorf("%s: scale %v", op, scale)
	}
	qUsed, kUsed := make([]bool, tq), make([]bool, tk)
	for i, s := range spans {
		if s.Q < 0 || s.QLen < 0 || s.Q+s.QLen > tq || s.K < 0 || s.KLen < 0 || s.K+s.KLen > tk {
			return 0, 0, 0, 0, 0, fmt.Errorf("%s: span %d (q %d+%d, k %d+%d) is outside %d query and %d key rows", op, i, s.Q, s.QLen, s.K, s.KLen, tq, tk)
		}
		for r := s.Q; r < s.Q+s.QLen; r++ {
			if qUsed[r] {
				return 0, 0, 0, 0, 0, fmt.Errorf("%s: spans overlap at query row %d", op, r)
			}
			qUsed[r] = true
		}
		for r := s.K; r < s.K+s.KLen; r++ {
			if kUsed[r] {
				return 0, 0, 0, 0, 0, fmt.Errorf("%s: spans overlap at key row %d", op, r)
			}
			kUsed[r] = true
		}
	}
	return tq, tk, hq, hkv, d, nil
}

// CheckSpanAttention checks the outputs of span attention: out [Tq,Hq,D]
// and lse [Hq,Tq].
func CheckSpanAttention(op string, out, lse Tensor, tq, hq, d int) error {
	if err := CheckShape(op, "out", out, tq, hq, d); err != nil {
		return err
	}
	return CheckShape(op, "lse", lse, hq, tq)
}

// CheckSpanAttentionBackward checks the operands of the span attention
// backward: dq, dout and out [Tq,Hq,D], dk and dv [Tk,Hkv,D], lse [Hq,Tq].
func CheckSpanAttentionBackward(op string, dq, dk, dv, dout, out, lse Tensor, tq, tk, hq, hkv, d int) error {
	for _, c := range []struct {
		n string
		t Tensor
		s []int
	}{{"dq", dq, []int{tq, hq, d}}, {"dout", dout, []int{tq, hq, d}}, {"out", out, []int{tq, hq, d}},
		{"dk", dk, []int{tk, hkv, d}}, {"dv", dv, []int{tk, hkv, d}}, {"lse", lse, []int{hq, tq}}} {
		if err := CheckShape(op, c.n, c.t, c.s...); err != nil {
			return err
		}
	}
	return nil
}

// MergeAttentionDims checks the operands of the merge of attention blocks,
// out and bout [T,H,D], lse and blse [H,T], and returns T, H and D.
func MergeAttentionDims(op string, out, lse, bout, blse Tensor) (t, h, d int, err error) {
	if len(out.Shape) != 3 || !SameShape(out.Shape, bout.Shape) {
		return 0, 0, 0, fmt.Errorf("%s: out %v and bout %v must be equal [T,H,D]", op, out.Shape, bout.Shape)
	}
	t, h, d = out.Shape[0], out.Shape[1], out.Shape[2]
	if err := CheckShape(op, "lse", lse, h, t); err != nil {
		return 0, 0, 0, err
	}
	if err := CheckShape(op, "blse", blse, h, t); err != nil {
		return 0, 0, 0, err
	}
	return t, h, d, nil
}
