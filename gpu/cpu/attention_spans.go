package cpu

import (
	"fmt"
	"math"

	"github.com/rlpipe/rlpipe/gpu"
)

// The block attention of context parallelism. A rank holds some rows of
// every sequence; ring attention takes its queries through the key/value
// blocks of the other ranks one at a time, and the blocks a query row sees
// in full are non-causal attention between row spans. These ops compute
// one such block, and merge blocks with the log-sum-exp rule; the causal
// block of a rank's own rows is Attention.

// spanSet is the checked spans of a block: query rows [qs, qs+ql) attend
// key rows [ks, ks+kl).
type spanSet struct {
	qs, ql, ks, kl []int
}

// spanDims are the checked dimensions and views of a spans call.
type spanDims struct {
	tq, tk, hq, hkv, d, group int
	q, k, v                   fview
	sp                        spanSet
}

func spansCheck(op string, q, k, v, spans gpu.Tensor, scale float32) (spanDims, error) {
	var a spanDims
	if q.DType != k.DType || q.DType != v.DType {
		return a, fmt.Errorf("%s: q, k and v dtypes differ: %v, %v, %v", op, q.DType, k.DType, v.DType)
	}
	if len(q.Shape) != 3 || len(k.Shape) != 3 || !gpu.SameShape(k.Shape, v.Shape) {
		return a, fmt.Errorf("%s: want q [Tq,Hq,D] and k, v [Tk,Hkv,D], got %v, %v, %v", op, q.Shape, k.Shape, v.Shape)
	}
	a.tq, a.hq, a.d = q.Shape[0], q.Shape[1], q.Shape[2]
	a.tk, a.hkv = k.Shape[0], k.Shape[1]
	if k.Shape[2] != a.d || a.hkv == 0 || a.hq%a.hkv != 0 {
		return a, fmt.Errorf("%s: heads or head dims do not match: q %v, k %v", op, q.Shape, k.Shape)
	}
	if scale <= 0 || math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0) {
		return a, fmt.Errorf("%s: scale %v", op, scale)
	}
	a.group = a.hq / a.hkv
	raw, err := i32View(op, "spans", spans)
	if err != nil {
		return a, err
	}
	if len(spans.Shape) != 2 || spans.Shape[1] != 4 {
		return a, fmt.Errorf("%s: spans must be [S,4] (q start, q length, k start, k length), got %v", op, spans.Shape)
	}
	qUsed, kUsed := make([]bool, a.tq), make([]bool, a.tk)
	for s := range spans.Shape[0] {
		qs, ql, ks, kl := int(raw[4*s]), int(raw[4*s+1]), int(raw[4*s+2]), int(raw[4*s+3])
		if qs < 0 || ql < 0 || qs+ql > a.tq || ks < 0 || kl < 0 || ks+kl > a.tk {
			return a, fmt.Errorf("%s: span %d (q %d+%d, k %d+%d) is outside %d query and %d key rows", op, s, qs, ql, ks, kl, a.tq, a.tk)
		}
		for i := qs; i < qs+ql; i++ {
			if qUsed[i] {
				return a, fmt.Errorf("%s: spans overlap at query row %d", op, i)
			}
			qUsed[i] = true
		}
		for j := ks; j < ks+kl; j++ {
			if kUsed[j] {
				return a, fmt.Errorf("%s: spans overlap at key row %d", op, j)
			}
			kUsed[j] = true
		}
		a.sp.qs, a.sp.ql, a.sp.ks, a.sp.kl = append(a.sp.qs, qs), append(a.sp.ql, ql), append(a.sp.ks, ks), append(a.sp.kl, kl)
	}
	if a.q, err = floatView(op, "q", q); err != nil {
		return a, err
	}
	if a.k, err = floatView(op, "k", k); err != nil {
		return a, err
	}
	a.v, err = floatView(op, "v", v)
	return a, err
}

// checkShape reports a tensor whose shape is not want.
func checkShape(op, name string, t gpu.Tensor, want ...int) error {
	if !gpu.SameShape(t.Shape, want) {
		return fmt.Errorf("%s: %s is %v, want %v", op, name, t.Shape, want)
	}
	return nil
}

// AttentionSpans is non-causal grouped-query attention between row spans:
// for every span s of spans (I32 [S,4]: query start, query length, key
// start, key length) the query rows [qs, qs+ql) of q [Tq,Hq,D] attend every
// key row [ks, ks+kl) of k and v [Tk,Hkv,D]. It writes out [Tq,Hq,D] and
// lse F32 [Hq,Tq] for the spans' query rows, and 0 and −Inf for the other
// rows, which MergeAttention then leaves as they were. Spans must not
// share query or key rows.
func (b *Backend) AttentionSpans(out, lse, q, k, v, spans gpu.Tensor, scale float32) error {
	const op = "attention spans"
	a, err := spansCheck(op, q, k, v, spans, scale)
	if err != nil {
		return err
	}
	if err := checkShape(op, "out", out, a.tq, a.hq, a.d); err != nil {
		return err
	}
	if err := checkShape(op, "lse", lse, a.hq, a.tq); err != nil {
		return err
	}
	ov, err := floatView(op, "out", out)
	if err != nil {
		return err
	}
	lv, err := f32View(op, "lse", lse)
	if err != nil {
		return err
	}
	zero := make([]float32, a.d)
	for i := range a.tq {
		for h := range a.hq {
			ov.store((i*a.hq+h)*a.d, zero)
			lv[h*a.tq+i] = float32(math.Inf(-1))
		}
	}
	d := a.d
	type task struct{ s, h int }
	var ts []task
	for s := range a.sp.qs {
		for h := range a.hq {
			ts = append(ts, task{s, h})
		}
	}
	tasks(b, len(ts), func() *attnScratch { return newAttnScratch(d) }, func(sc *attnScratch, ti int) {
		s, h := ts[ti].s, ts[ti].h
		hk := h / a.group
		ks, kl := a.sp.ks[s], a.sp.kl[s]
		if kl == 0 {
			return
		}
		scores := make([]float32, kl)
		qr, kr, acc := sc.row, make([]float32, d), make([]float32, d)
		for i := a.sp.qs[s]; i < a.sp.qs[s]+a.sp.ql[s]; i++ {
			a.q.load(qr, (i*a.hq+h)*d)
			mx := float32(math.Inf(-1))
			for j := range kl {
				a.k.load(kr, ((ks+j)*a.hkv+hk)*d)
				scores[j] = scale * dot(qr, kr)
				mx = max(mx, scores[j])
			}
			clear(acc)
			var l float32
			for j, sv := range scores {
				p := float32(math.Exp(float64(sv - mx)))
				l += p
				a.v.load(kr, ((ks+j)*a.hkv+hk)*d)
				axpy(acc, p, kr)
			}
			for x := range acc {
				acc[x] /= l
			}
			ov.store((i*a.hq+h)*d, acc)
			lv[h*a.tq+i] = mx + float32(math.Log(float64(l)))
		}
	})
	return nil
}

// AttentionSpansBackward computes one block's part of the attention
// backward: from dout and the rows' final out and lse (the attention merged
// over every block), it writes dq [Tq,Hq,D] for the spans' query rows, and
// dk and dv [Tk,Hkv,D] for their key rows (summed over the query heads of a
// kv head), zero elsewhere. Summing the blocks' dq, and each key row's dk
// and dv over the blocks that saw it, gives the gradients of the whole
// attention.
func (b *Backend) AttentionSpansBackward(dq, dk, dv, dout, out, lse, q, k, v, spans gpu.Tensor, scale float32) error {
	const op = "attention spans backward"
	a, err := spansCheck(op, q, k, v, spans, scale)
	if err != nil {
		return err
	}
	for _, c := range []struct {
		n string
		t gpu.Tensor
		s []int
	}{{"dq", dq, []int{a.tq, a.hq, a.d}}, {"dout", dout, []int{a.tq, a.hq, a.d}}, {"out", out, []int{a.tq, a.hq, a.d}},
		{"dk", dk, []int{a.tk, a.hkv, a.d}}, {"dv", dv, []int{a.tk, a.hkv, a.d}}, {"lse", lse, []int{a.hq, a.tq}}} {
		if err := checkShape(op, c.n, c.t, c.s...); err != nil {
			return err
		}
	}
	dqv, dkv, dvv, dov, ov, lv, err := backwardViews(op, dq, dk, dv, dout, out, lse)
	if err != nil {
		return err
	}
	d := a.d
	zero := make([]float32, d)
	for i := range a.tq {
		for h := range a.hq {
			dqv.store((i*a.hq+h)*d, zero)
		}
	}
	for j := range a.tk {
		for h := range a.hkv {
			dkv.store((j*a.hkv+h)*d, zero)
			dvv.store((j*a.hkv+h)*d, zero)
		}
	}
	// One task per span and kv head: it owns the span's key rows of that
	// head and the span's query rows of the group's query heads.
	type task struct{ s, hk int }
	var ts []task
	for s := range a.sp.qs {
		for hk := range a.hkv {
			ts = append(ts, task{s, hk})
		}
	}
	tasks(b, len(ts), func() *attnScratch { return newAttnScratch(d) }, func(sc *attnScratch, ti int) {
		s, hk := ts[ti].s, ts[ti].hk
		ks, kl := a.sp.ks[s], a.sp.kl[s]
		dka, dva := make([]float32, kl*d), make([]float32, kl*d)
		qr, gr, orow, kr, vr, dqa := make([]float32, d), make([]float32, d), make([]float32, d), make([]float32, d), make([]float32, d), make([]float32, d)
		for h := hk * a.group; h < (hk+1)*a.group; h++ {
			for i := a.sp.qs[s]; i < a.sp.qs[s]+a.sp.ql[s]; i++ {
				off := (i*a.hq + h) * d
				a.q.load(qr, off)
				dov.load(gr, off)
				ov.load(orow, off)
				m, delta := lv[h*a.tq+i], dot(gr, orow)
				clear(dqa)
				for j := range kl {
					a.k.load(kr, ((ks+j)*a.hkv+hk)*d)
					a.v.load(vr, ((ks+j)*a.hkv+hk)*d)
					p := float32(math.Exp(float64(scale*dot(qr, kr) - m)))
					ds := scale * p * (dot(gr, vr) - delta)
					axpy(dqa, ds, kr)
					axpy(dva[j*d:(j+1)*d], p, gr)
					axpy(dka[j*d:(j+1)*d], ds, qr)
				}
				dqv.store(off, dqa)
			}
		}
		for j := range kl {
			off := ((ks+j)*a.hkv + hk) * d
			dkv.store(off, dka[j*d:(j+1)*d])
			dvv.store(off, dva[j*d:(j+1)*d])
		}
	})
	return nil
}

// MergeAttention folds a block's partial attention (bout [T,H,D], blse F32
// [H,T]) into the running (out, lse), in place: lse' = log(e^lse +
// e^blse) and out' = out·e^(lse−lse') + bout·e^(blse−lse'). Rows where
// blse is −Inf keep their values.
func (b *Backend) MergeAttention(out, lse, bout, blse gpu.Tensor) error {
	const op = "merge attention"
	if len(out.Shape) != 3 || !gpu.SameShape(out.Shape, bout.Shape) {
		return fmt.Errorf("%s: out %v and bout %v must be equal [T,H,D]", op, out.Shape, bout.Shape)
	}
	t, hn, d := out.Shape[0], out.Shape[1], out.Shape[2]
	if err := checkShape(op, "lse", lse, hn, t); err != nil {
		return err
	}
	if err := checkShape(op, "blse", blse, hn, t); err != nil {
		return err
	}
	ov, err := floatView(op, "out", out)
	if err != nil {
		return err
	}
	bv, err := floatView(op, "bout", bout)
	if err != nil {
		return err
	}
	lv, err := f32View(op, "lse", lse)
	if err != nil {
		return err
	}
	blv, err := f32View(op, "blse", blse)
	if err != nil {
		return err
	}
	x, y := make([]float32, d), make([]float32, d)
	for i := range t {
		for h := range hn {
			l1, l2 := lv[h*t+i], blv[h*t+i]
			if math.IsInf(float64(l2), -1) {
				continue
			}
			mx := max(l1, l2)
			w1 := float32(math.Exp(float64(l1 - mx)))
			w2 := float32(math.Exp(float64(l2 - mx)))
			ln := mx + float32(math.Log(float64(w1+w2)))
			w1, w2 = w1/(w1+w2), w2/(w1+w2)
			off := (i*hn + h) * d
			ov.load(x, off)
			bv.load(y, off)
			for e := range x {
				x[e] = w1*x[e] + w2*y[e]
			}
			ov.store(off, x)
			lv[h*t+i] = ln
		}
	}
	return nil
}
