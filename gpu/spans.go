package gpu

import (
	"fmt"
	"math"
)

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
