package cpu

import (
	"fmt"
	"math"

	"github.com/rlpipe/rlpipe/gpu"
)

// Attention tile sizes: a task handles attBQ query rows of one head (or
// attBK key rows of one kv head in the backward), streaming the other side
// in tiles, so scratch is O((attBQ+attBK)·D) per worker.
const (
	attBQ = 32
	attBK = 32
)

// attnDims are the checked dimensions and views of an attention call.
type attnDims struct {
	t, hq, hkv, d, group int
	cu                   []int32
	q, k, v              fview
}

// span is a block of rows [lo,hi) of sequence [st,en), for head h.
type span struct {
	lo, hi, st, en, h int
}

func attnCheck(op string, q, k, v, cuSeqlens gpu.Tensor, scale float32) (attnDims, error) {
	var a attnDims
	var err error
	if a.t, a.hq, a.hkv, a.d, err = gpu.AttentionDims(op, q, k, v, cuSeqlens, scale); err != nil {
		return a, err
	}
	a.group = a.hq / a.hkv
	cu, err := i32View(op, "cuSeqlens", cuSeqlens)
	if err != nil {
		return a, err
	}
	if len(cu) == 0 || cu[0] != 0 || int(cu[len(cu)-1]) != a.t {
		return a, fmt.Errorf("%s: cuSeqlens must start at 0 and end at %d tokens, got %v", op, a.t, cu)
	}
	for i := 1; i < len(cu); i++ {
		if cu[i] < cu[i-1] {
			return a, fmt.Errorf("%s: cuSeqlens decreases at index %d: %v", op, i, cu)
		}
	}
	a.cu = cu
	if a.q, err = floatView(op, "q", q); err != nil {
		return a, err
	}
	if a.k, err = floatView(op, "k", k); err != nil {
		return a, err
	}
	if a.v, err = floatView(op, "v", v); err != nil {
		return a, err
	}
	return a, nil
}

// blocks lists, for every sequence and each of heads heads, the row blocks
// of size bs.
func (a *attnDims) blocks(heads, bs int) []span {
	var out []span
	for s := 0; s+1 < len(a.cu); s++ {
		st, en := int(a.cu[s]), int(a.cu[s+1])
		for h := range heads {
			for lo := st; lo < en; lo += bs {
				out = append(out, span{lo: lo, hi: min(lo+bs, en), st: st, en: en, h: h})
			}
		}
	}
	return out
}

// loadRows converts rows [lo,hi) of head h of a [T,H,D] view into dst.
func loadRows(dst []float32, v fview, lo, hi, heads, h, d int) {
	for i := lo; i < hi; i++ {
		v.load(dst[(i-lo)*d:(i-lo+1)*d], (i*heads+h)*d)
	}
}

func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func axpy(dst []float32, s float32, x []float32) {
	x = x[:len(dst)]
	for i, v := range x {
		dst[i] += s * v
	}
}

type attnScratch struct {
	qf, kf, vf, acc, of, dof []float32
	m, l, sc, row            []float32
}

func newAttnScratch(d int) *attnScratch {
	return &attnScratch{
		qf: make([]float32, attBQ*d), kf: make([]float32, attBK*d), vf: make([]float32, attBK*d),
		acc: make([]float32, max(attBQ, attBK)*d), of: make([]float32, max(attBQ, attBK)*d),
		dof: make([]float32, attBQ*d),
		m:   make([]float32, attBQ), l: make([]float32, attBQ), sc: make([]float32, attBK),
		row: make([]float32, d),
	}
}

// Attention computes causal varlen GQA attention with an online softmax.
func (b *Backend) Attention(out, lse, q, k, v, cuSeqlens gpu.Tensor, scale float32) error {
	const op = "attention"
	a, err := attnCheck(op, q, k, v, cuSeqlens, scale)
	if err != nil {
		return err
	}
	if err := gpu.CheckAttention(op, out, lse, q, k, v, cuSeqlens, a.t, a.hq, a.d); err != nil {
		return err
	}
	ov, lv, err := forwardViews(op, out, lse)
	if err != nil {
		return err
	}
	d := a.d
	blocks := a.blocks(a.hq, attBQ)
	tasks(b, len(blocks), func() *attnScratch { return newAttnScratch(d) }, func(s *attnScratch, ti int) {
		bl := blocks[ti]
		nq := bl.hi - bl.lo
		hk := bl.h / a.group
		loadRows(s.qf, a.q, bl.lo, bl.hi, a.hq, bl.h, d)
		acc := s.acc[:nq*d]
		clear(acc)
		m, l := s.m[:nq], s.l[:nq]
		for r := range m {
			m[r] = float32(math.Inf(-1))
			l[r] = 0
		}
		for j0 := bl.st; j0 < bl.hi; j0 += attBK {
			j1 := min(j0+attBK, bl.hi)
			loadRows(s.kf, a.k, j0, j1, a.hkv, hk, d)
			loadRows(s.vf, a.v, j0, j1, a.hkv, hk, d)
			for r := range nq {
				i := bl.lo + r
				jm := min(j1, i+1)
				if jm <= j0 {
					continue
				}
				qr := s.qf[r*d : (r+1)*d]
				sc := s.sc[:jm-j0]
				mx := m[r]
				for j := range sc {
					sc[j] = scale * dot(qr, s.kf[j*d:(j+1)*d])
					mx = max(mx, sc[j])
				}
				ar := acc[r*d : (r+1)*d]
				if mx > m[r] {
					corr := float32(math.Exp(float64(m[r] - mx)))
					l[r] *= corr
					for x := range ar {
						ar[x] *= corr
					}
					m[r] = mx
				}
				for j, sv := range sc {
					p := float32(math.Exp(float64(sv - mx)))
					l[r] += p
					axpy(ar, p, s.vf[j*d:(j+1)*d])
				}
			}
		}
		for r := range nq {
			i := bl.lo + r
			ar := acc[r*d : (r+1)*d]
			inv := 1 / l[r]
			for x := range ar {
				ar[x] *= inv
			}
			ov.store((i*a.hq+bl.h)*d, ar)
			lv[bl.h*a.t+i] = m[r] + float32(math.Log(float64(l[r])))
		}
	})
	return nil
}

// AttentionBackward computes dq, dk and dv for Attention.
func (b *Backend) AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, cuSeqlens gpu.Tensor, scale float32) error {
	const op = "attention backward"
	a, err := attnCheck(op, q, k, v, cuSeqlens, scale)
	if err != nil {
		return err
	}
	if err := gpu.CheckAttentionBackward(op, dq, dk, dv, dout, out, lse, q, k, v, cuSeqlens, a.t, a.hq, a.hkv, a.d); err != nil {
		return err
	}
	dqv, dkv, dvv, dov, ov, lv, err := backwardViews(op, dq, dk, dv, dout, out, lse)
	if err != nil {
		return err
	}
	d := a.d
	newScratch := func() *attnScratch { return newAttnScratch(d) }

	// loadQ loads q, dout, lse and delta = rowsum(dout*out) for rows
	// [lo,hi) of query head h.
	loadQ := func(s *attnScratch, lo, hi, h int) {
		loadRows(s.qf, a.q, lo, hi, a.hq, h, d)
		loadRows(s.dof, dov, lo, hi, a.hq, h, d)
		for r := range hi - lo {
			ov.load(s.row, ((lo+r)*a.hq+h)*d)
			s.m[r] = lv[h*a.t+lo+r]
			s.l[r] = dot(s.dof[r*d:(r+1)*d], s.row)
		}
	}

	// Pass 1: dq, one task per block of query rows of a head.
	qblocks := a.blocks(a.hq, attBQ)
	tasks(b, len(qblocks), newScratch, func(s *attnScratch, ti int) {
		bl := qblocks[ti]
		nq := bl.hi - bl.lo
		hk := bl.h / a.group
		loadQ(s, bl.lo, bl.hi, bl.h)
		acc := s.acc[:nq*d]
		clear(acc)
		for j0 := bl.st; j0 < bl.hi; j0 += attBK {
			j1 := min(j0+attBK, bl.hi)
			loadRows(s.kf, a.k, j0, j1, a.hkv, hk, d)
			loadRows(s.vf, a.v, j0, j1, a.hkv, hk, d)
			for r := range nq {
				i := bl.lo + r
				qr, gr, ar := s.qf[r*d:(r+1)*d], s.dof[r*d:(r+1)*d], acc[r*d:(r+1)*d]
				for j := j0; j < min(j1, i+1); j++ {
					kr := s.kf[(j-j0)*d : (j-j0+1)*d]
					p := float32(math.Exp(float64(scale*dot(qr, kr) - s.m[r])))
					dp := dot(gr, s.vf[(j-j0)*d:(j-j0+1)*d])
					axpy(ar, scale*p*(dp-s.l[r]), kr)
				}
			}
		}
		for r := range nq {
			dqv.store(((bl.lo+r)*a.hq+bl.h)*d, acc[r*d:(r+1)*d])
		}
	})

	// Pass 2: dk and dv, one task per block of key rows of a kv head,
	// summing over the query heads of its group.
	kblocks := a.blocks(a.hkv, attBK)
	tasks(b, len(kblocks), newScratch, func(s *attnScratch, ti int) {
		bl := kblocks[ti]
		nk := bl.hi - bl.lo
		hk := bl.h
		loadRows(s.kf, a.k, bl.lo, bl.hi, a.hkv, hk, d)
		loadRows(s.vf, a.v, bl.lo, bl.hi, a.hkv, hk, d)
		dka, dva := s.acc[:nk*d], s.of[:nk*d]
		clear(dka)
		clear(dva)
		for h := hk * a.group; h < (hk+1)*a.group; h++ {
			for i0 := bl.lo; i0 < bl.en; i0 += attBQ {
				i1 := min(i0+attBQ, bl.en)
				loadQ(s, i0, i1, h)
				for r := range i1 - i0 {
					i := i0 + r
					qr, gr := s.qf[r*d:(r+1)*d], s.dof[r*d:(r+1)*d]
					for j := bl.lo; j < min(bl.hi, i+1); j++ {
						c := j - bl.lo
						kr := s.kf[c*d : (c+1)*d]
						p := float32(math.Exp(float64(scale*dot(qr, kr) - s.m[r])))
						axpy(dva[c*d:(c+1)*d], p, gr)
						dp := dot(gr, s.vf[c*d:(c+1)*d])
						axpy(dka[c*d:(c+1)*d], scale*p*(dp-s.l[r]), qr)
					}
				}
			}
		}
		for c := range nk {
			off := ((bl.lo+c)*a.hkv + hk) * d
			dkv.store(off, dka[c*d:(c+1)*d])
			dvv.store(off, dva[c*d:(c+1)*d])
		}
	})
	return nil
}

// forwardViews returns the views an attention forward writes.
func forwardViews(op string, out, lse gpu.Tensor) (fview, []float32, error) {
	ov, err := floatView(op, "out", out)
	if err != nil {
		return fview{}, nil, err
	}
	lv, err := f32View(op, "lse", lse)
	return ov, lv, err
}

// backwardViews returns the views an attention backward reads and writes.
func backwardViews(op string, dq, dk, dv, dout, out, lse gpu.Tensor) (dqv, dkv, dvv, dov, ov fview, lv []float32, err error) {
	views := make([]fview, 5)
	for i, x := range []struct {
		n string
		t gpu.Tensor
	}{{"dq", dq}, {"dk", dk}, {"dv", dv}, {"dout", dout}, {"out", out}} {
		if views[i], err = floatView(op, x.n, x.t); err != nil {
			return
		}
	}
	lv, err = f32View(op, "lse", lse)
	return views[0], views[1], views[2], views[3], views[4], lv, err
}
