package cpu

import (
	"math"

	"github.com/rlpipe/rlpipe/gpu"
)

// The block attention of context parallelism. A rank holds some rows of
// every sequence; ring attention takes its queries through the key/value
// blocks of the other ranks one at a time, and the blocks a query row sees
// in full are non-causal attention between row spans. These ops compute
// one such block, and merge blocks with the log-sum-exp rule; the causal
// block of a rank's own rows is Attention.

// spanDims are the checked dimensions and views of a spans call.
type spanDims struct {
	tq, tk, hq, hkv, d, group int
	q, k, v                   fview
	sp                        []gpu.Span
}

func spansCheck(op string, q, k, v gpu.Tensor, spans []gpu.Span, scale float32) (spanDims, error) {
	a := spanDims{sp: spans}
	var err error
	if a.tq, a.tk, a.hq, a.hkv, a.d, err = gpu.SpanAttentionDims(op, q, k, v, spans, scale); err != nil {
		return a, err
	}
	a.group = a.hq / a.hkv
	if a.q, err = floatView(op, "q", q); err != nil {
		return a, err
	}
	if a.k, err = floatView(op, "k", k); err != nil {
		return a, err
	}
	a.v, err = floatView(op, "v", v)
	return a, err
}

// AttentionSpans is non-causal grouped-query attention between row spans:
// for every span the query rows [Q, Q+QLen) of q [Tq,Hq,D] attend every
// key row [K, K+KLen) of k and v [Tk,Hkv,D]. It writes out [Tq,Hq,D] and
// lse F32 [Hq,Tq] for the spans' query rows, and 0 and −Inf for the other
// rows, which MergeAttention then leaves as they were. Spans must not
// share query or key rows.
func (b *Backend) AttentionSpans(out, lse, q, k, v gpu.Tensor, spans []gpu.Span, scale float32) error {
	const op = "attention spans"
	a, err := spansCheck(op, q, k, v, spans, scale)
	if err != nil {
		return err
	}
	if err := gpu.CheckSpanAttention(op, out, lse, a.tq, a.hq, a.d); err != nil {
		return err
	}
	ov, lv, err := forwardViews(op, out, lse)
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
	for s := range a.sp {
		for h := range a.hq {
			ts = append(ts, task{s, h})
		}
	}
	tasks(b, len(ts), func() *attnScratch { return newAttnScratch(d) }, func(sc *attnScratch, ti int) {
		s, h := ts[ti].s, ts[ti].h
		hk := h / a.group
		ks, kl := a.sp[s].K, a.sp[s].KLen
		if kl == 0 {
			return
		}
		scores := make([]float32, kl)
		qr, kr, acc := sc.row, make([]float32, d), make([]float32, d)
		for i := a.sp[s].Q; i < a.sp[s].Q+a.sp[s].QLen; i++ {
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
func (b *Backend) AttentionSpansBackward(dq, dk, dv, dout, out, lse, q, k, v gpu.Tensor, spans []gpu.Span, scale float32) error {
	const op = "attention spans backward"
	a, err := spansCheck(op, q, k, v, spans, scale)
	if err != nil {
		return err
	}
	if err := gpu.CheckSpanAttentionBackward(op, dq, dk, dv, dout, out, lse, a.tq, a.tk, a.hq, a.hkv, a.d); err != nil {
		return err
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
	for s := range a.sp {
		for hk := range a.hkv {
			ts = append(ts, task{s, hk})
		}
	}
	tasks(b, len(ts), func() *attnScratch { return newAttnScratch(d) }, func(sc *attnScratch, ti int) {
		s, hk := ts[ti].s, ts[ti].hk
		ks, kl := a.sp[s].K, a.sp[s].KLen
		dka, dva := make([]float32, kl*d), make([]float32, kl*d)
		qr, gr, orow, kr, vr, dqa := make([]float32, d), make([]float32, d), make([]float32, d), make([]float32, d), make([]float32, d), make([]float32, d)
		for h := hk * a.group; h < (hk+1)*a.group; h++ {
			for i := a.sp[s].Q; i < a.sp[s].Q+a.sp[s].QLen; i++ {
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
	t, hn, d, err := gpu.MergeAttentionDims(op, out, lse, bout, blse)
	if err != nil {
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
