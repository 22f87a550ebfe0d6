package cpu

import (
	"fmt"
	"math"

	"github.com/rlpipe/rlpipe/gpu"
)

// rowChunk is the minimum number of rows of width h a worker should get so
// that goroutine start-up stays small against the work.
func rowChunk(h int) int { return max(1, 8192/max(h, 1)) }

// Embedding gathers rows of table by ids.
func (b *Backend) Embedding(dst, table, ids gpu.Tensor) error {
	const op = "embedding"
	v, h, t, err := gpu.EmbeddingDims(op, false, table, dst, ids)
	if err != nil {
		return err
	}
	idv, err := i32View(op, "ids", ids)
	if err != nil {
		return err
	}
	dv, err := floatView(op, "dst", dst)
	if err != nil {
		return err
	}
	tv, err := floatView(op, "table", table)
	if err != nil {
		return err
	}
	if err := checkIDs(op, "ids", idv, v); err != nil {
		return err
	}
	b.parallel(t, rowChunk(h), func(_, lo, hi int) {
		buf := make([]float32, h)
		for r := lo; r < hi; r++ {
			dv.store(r*h, tv.get(buf, int(idv[r])*h, h))
		}
	})
	return nil
}

func checkIDs(op, name string, ids []int32, v int) error {
	for i, id := range ids {
		if id < 0 || int(id) >= v {
			return fmt.Errorf("%s: %s[%d] = %d is outside [0,%d)", op, name, i, id, v)
		}
	}
	return nil
}

// CopyRows copies the listed rows: dst[rows[j]] = src[rows[j]].
func (b *Backend) CopyRows(dst, src, rows gpu.Tensor) error {
	const op = "copy rows"
	v, h, _, err := gpu.CopyRowsDims(op, dst, src, rows)
	if err != nil {
		return err
	}
	rv, err := i32View(op, "rows", rows)
	if err != nil {
		return err
	}
	if err := checkIDs(op, "rows", rv, v); err != nil {
		return err
	}
	d, err := bytesOf(dst)
	if err != nil {
		return fmt.Errorf("%s: dst: %w", op, err)
	}
	s, err := bytesOf(src)
	if err != nil {
		return fmt.Errorf("%s: src: %w", op, err)
	}
	w := h * src.DType.Size()
	b.parallel(len(rv), rowChunk(h), func(_, lo, hi int) {
		for _, r := range rv[lo:hi] {
			o := int(r) * w
			copy(d[o:o+w], s[o:o+w])
		}
	})
	return nil
}

// EmbeddingBackward accumulates dTable[ids[t]] += dY[t].
func (b *Backend) EmbeddingBackward(dTable, dY, ids gpu.Tensor) error {
	const op = "embedding backward"
	v, h, _, err := gpu.EmbeddingDims(op, true, dTable, dY, ids)
	if err != nil {
		return err
	}
	idv, err := i32View(op, "ids", ids)
	if err != nil {
		return err
	}
	dtv, err := floatView(op, "dTable", dTable)
	if err != nil {
		return err
	}
	dyv, err := floatView(op, "dY", dY)
	if err != nil {
		return err
	}
	if err := checkIDs(op, "ids", idv, v); err != nil {
		return err
	}
	// Split columns, not tokens, so repeated ids never race.
	b.parallel(h, 64, func(_, lo, hi int) {
		w := hi - lo
		g, d := make([]float32, w), make([]float32, w)
		for r, id := range idv {
			gr := dyv.get(g, r*h+lo, w)
			off := int(id)*h + lo
			dr := dtv.get(d, off, w)
			for j, x := range gr {
				dr[j] += x
			}
			dtv.store(off, dr)
		}
	})
	return nil
}

// RMSNorm normalises the rows of x as HF Llama/Qwen2 RMSNorm does.
func (b *Backend) RMSNorm(dst, rstd, x, w gpu.Tensor, eps float32) error {
	const op = "rmsnorm"
	t, h, err := gpu.RMSNormDims(op, dst, rstd, x, w, eps)
	if err != nil {
		return err
	}
	xv, err := floatView(op, "x", x)
	if err != nil {
		return err
	}
	dv, err := floatView(op, "dst", dst)
	if err != nil {
		return err
	}
	wv, err := floatView(op, "w", w)
	if err != nil {
		return err
	}
	rs, err := f32View(op, "rstd", rstd)
	if err != nil {
		return err
	}
	wf := make([]float32, h)
	wv.load(wf, 0)
	b.parallel(t, rowChunk(h), func(_, lo, hi int) {
		xb, ob := make([]float32, h), make([]float32, h)
		for r := lo; r < hi; r++ {
			xr := xv.get(xb, r*h, h)
			ss := 0.0
			for _, v := range xr {
				ss += float64(v) * float64(v)
			}
			var mean float64
			if h > 0 {
				mean = ss / float64(h)
			}
			rv := float32(1 / math.Sqrt(float64(float32(mean)+eps)))
			rs[r] = rv
			for j, v := range xr {
				ob[j] = wf[j] * gpu.Round(x.DType, v*rv)
			}
			dv.store(r*h, ob)
		}
	})
	return nil
}

// RMSNormBackward computes dx and accumulates dw.
func (b *Backend) RMSNormBackward(dx, dw, dy, x, w, rstd gpu.Tensor) error {
	const op = "rmsnorm backward"
	t, h, err := gpu.RMSNormBackwardDims(op, dx, dw, dy, x, w, rstd)
	if err != nil {
		return err
	}
	withDW := dw.Mem != nil
	dxv, err := floatView(op, "dx", dx)
	if err != nil {
		return err
	}
	dyv, err := floatView(op, "dy", dy)
	if err != nil {
		return err
	}
	xv, err := floatView(op, "x", x)
	if err != nil {
		return err
	}
	wv, err := floatView(op, "w", w)
	if err != nil {
		return err
	}
	rs, err := f32View(op, "rstd", rstd)
	if err != nil {
		return err
	}
	var dwv fview
	if withDW {
		if dwv, err = floatView(op, "dw", dw); err != nil {
			return err
		}
	}
	wf := make([]float32, h)
	wv.load(wf, 0)
	nw := b.workers(t, rowChunk(h))
	parts := make([][]float64, nw)
	b.parallel(t, rowChunk(h), func(wi, lo, hi int) {
		xb, gb, ob := make([]float32, h), make([]float32, h), make([]float32, h)
		var acc []float64
		if withDW {
			acc = make([]float64, h)
			parts[wi] = acc
		}
		for r := lo; r < hi; r++ {
			xr := xv.get(xb, r*h, h)
			gr := dyv.get(gb, r*h, h)
			rv := float64(rs[r])
			// dx = r*(g*w - xn*mean(g*w*xn)), xn = x*r.
			dot := 0.0
			for j, v := range xr {
				xn := float64(v) * rv
				gw := float64(gr[j]) * float64(wf[j])
				dot += gw * xn
				if withDW {
					acc[j] += float64(gr[j]) * xn
				}
			}
			if h > 0 {
				dot /= float64(h)
			}
			for j, v := range xr {
				xn := float64(v) * rv
				ob[j] = float32(rv * (float64(gr[j])*float64(wf[j]) - xn*dot))
			}
			dxv.store(r*h, ob)
		}
	})
	if withDW {
		for j := range h {
			s := float64(dwv.at(j))
			for _, p := range parts {
				if p != nil {
					s += p[j]
				}
			}
			dwv.set(j, float32(s))
		}
	}
	return nil
}

// ropeCheck validates RoPE operands and returns the views.
func ropeCheck(op string, x, pos gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) (fview, []int32, []float32, error) {
	if err := rank(op, "x", x, 3); err != nil {
		return fview{}, nil, nil, err
	}
	t := x.Shape[0]
	if err := need(op, "pos", pos, t); err != nil {
		return fview{}, nil, nil, err
	}
	if err := noAlias(op, "x", "pos", x, pos); err != nil {
		return fview{}, nil, nil, err
	}
	inv, err := gpu.RoPEInvFreq(x.Shape[2], theta, scaling)
	if err != nil {
		return fview{}, nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	xv, err := floatView(op, "x", x)
	if err != nil {
		return fview{}, nil, nil, err
	}
	pv, err := i32View(op, "pos", pos)
	if err != nil {
		return fview{}, nil, nil, err
	}
	return xv, pv, inv, nil
}

// RoPE rotates x in place (HF rotate-half convention and roundings).
func (b *Backend) RoPE(x, pos gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) error {
	return b.rope("rope", x, pos, theta, scaling, false)
}

// RoPEBackward rotates dx in place by the negative angle.
func (b *Backend) RoPEBackward(dx, pos gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) error {
	return b.rope("rope backward", dx, pos, theta, scaling, true)
}

func (b *Backend) rope(op string, x, pos gpu.Tensor, theta float64, scaling *gpu.RoPEScaling, backward bool) error {
	xv, pv, inv, err := ropeCheck(op, x, pos, theta, scaling)
	if err != nil {
		return err
	}
	t, heads, d := x.Shape[0], x.Shape[1], x.Shape[2]
	half := d / 2
	dt := x.DType
	b.parallel(t, rowChunk(heads*d), func(_, lo, hi int) {
		cs, sn, buf := make([]float32, half), make([]float32, half), make([]float32, d)
		for r := lo; r < hi; r++ {
			p := float32(pv[r])
			for i, f := range inv {
				a := float64(p * f) // freqs = pos*inv_freq in float32.
				cs[i] = gpu.Round(dt, float32(math.Cos(a)))
				sn[i] = gpu.Round(dt, float32(math.Sin(a)))
			}
			for hd := range heads {
				off := (r*heads + hd) * d
				row := xv.get(buf, off, d)
				for i := range half {
					x1, x2 := row[i], row[i+half]
					c, s := cs[i], sn[i]
					if backward {
						s = -s
					}
					// HF: q*cos + rotate_half(q)*sin, each term rounded.
					row[i] = gpu.Round(dt, gpu.Round(dt, x1*c)+gpu.Round(dt, -x2*s))
					row[i+half] = gpu.Round(dt, gpu.Round(dt, x2*c)+gpu.Round(dt, x1*s))
				}
				xv.store(off, row)
			}
		}
	})
	return nil
}

// elemCheck validates elementwise operands: identical shapes, float dtypes.
func elemCheck(op string, names []string, ts ...gpu.Tensor) ([]fview, error) {
	vs := make([]fview, len(ts))
	for i, t := range ts {
		if t.Mem == nil {
			return nil, fmt.Errorf("%s: %s is missing", op, names[i])
		}
		if i > 0 && !gpu.SameShape(t.Shape, ts[0].Shape) {
			return nil, fmt.Errorf("%s: %s has shape %v, %s has %v", op, names[i], t.Shape, names[0], ts[0].Shape)
		}
		v, err := floatView(op, names[i], t)
		if err != nil {
			return nil, err
		}
		vs[i] = v
	}
	return vs, nil
}

// elementwise runs fn over chunks of n elements with per-chunk float32
// buffers; fn receives the chunk offset and its length.
func (b *Backend) elementwise(n int, fn func(off, l int, bufs [][]float32)) {
	const chunk = 2048
	b.parallel((n+chunk-1)/chunk, 8, func(_, lo, hi int) {
		bufs := make([][]float32, 4)
		for i := range bufs {
			bufs[i] = make([]float32, chunk)
		}
		for c := lo; c < hi; c++ {
			off := c * chunk
			fn(off, min(chunk, n-off), bufs)
		}
	})
}

func sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

// SwiGLU computes out = silu(gate)*up.
func (b *Backend) SwiGLU(out, gate, up gpu.Tensor) error {
	const op = "swiglu"
	vs, err := elemCheck(op, []string{"out", "gate", "up"}, out, gate, up)
	if err != nil {
		return err
	}
	if err := gpu.CheckSwiGLU(op, out, gate, up); err != nil {
		return err
	}
	ov, gv, uv := vs[0], vs[1], vs[2]
	dt := gate.DType
	b.elementwise(ov.n, func(off, l int, bufs [][]float32) {
		g := gv.get(bufs[0], off, l)
		u := uv.get(bufs[1], off, l)
		o := bufs[2][:l]
		for i, x := range g {
			o[i] = gpu.Round(dt, x*sigmoid(x)) * u[i]
		}
		ov.store(off, o)
	})
	return nil
}

// SwiGLUBackward computes dGate and dUp.
func (b *Backend) SwiGLUBackward(dGate, dUp, dOut, gate, up gpu.Tensor) error {
	const op = "swiglu backward"
	vs, err := elemCheck(op, []string{"dGate", "dUp", "dOut", "gate", "up"}, dGate, dUp, dOut, gate, up)
	if err != nil {
		return err
	}
	if err := gpu.CheckSwiGLUBackward(op, dGate, dUp, dOut, gate, up); err != nil {
		return err
	}
	dgv, duv, dov, gv, uv := vs[0], vs[1], vs[2], vs[3], vs[4]
	dt := gate.DType
	b.elementwise(dgv.n, func(off, l int, bufs [][]float32) {
		d := dov.get(bufs[0], off, l)
		g := gv.get(bufs[1], off, l)
		u := uv.get(bufs[2], off, l)
		du := bufs[3][:l]
		for i, x := range g {
			s := sigmoid(x)
			du[i] = d[i] * gpu.Round(dt, x*s)
		}
		duv.store(off, du)
		// dGate is written after every read of dOut in this chunk.
		dg := du
		for i, x := range g {
			s := sigmoid(x)
			t := gpu.Round(dt, d[i]*u[i])
			dg[i] = t * (s * (1 + x*(1-s)))
		}
		dgv.store(off, dg)
	})
	return nil
}

// Add computes dst = a + b.
func (b *Backend) Add(dst, x, y gpu.Tensor) error {
	const op = "add"
	vs, err := elemCheck(op, []string{"dst", "a", "b"}, dst, x, y)
	if err != nil {
		return err
	}
	if err := aliasOK(op, "dst", "a", dst, x); err != nil {
		return err
	}
	if err := aliasOK(op, "dst", "b", dst, y); err != nil {
		return err
	}
	dv, av, bv := vs[0], vs[1], vs[2]
	b.elementwise(dv.n, func(off, l int, bufs [][]float32) {
		p := av.get(bufs[0], off, l)
		q := bv.get(bufs[1], off, l)
		o := bufs[2][:l]
		for i := range o {
			o[i] = p[i] + q[i]
		}
		dv.store(off, o)
	})
	return nil
}

// Scale computes x *= s.
func (b *Backend) Scale(x gpu.Tensor, s float32) error {
	vs, err := elemCheck("scale", []string{"x"}, x)
	if err != nil {
		return err
	}
	xv := vs[0]
	b.elementwise(xv.n, func(off, l int, bufs [][]float32) {
		p := xv.get(bufs[0], off, l)
		for i := range p {
			p[i] *= s
		}
		xv.store(off, p)
	})
	return nil
}

// AddScaled computes dst += s*x.
func (b *Backend) AddScaled(dst, x gpu.Tensor, s float32) error {
	const op = "addscaled"
	vs, err := elemCheck(op, []string{"dst", "x"}, dst, x)
	if err != nil {
		return err
	}
	if err := aliasOK(op, "dst", "x", dst, x); err != nil {
		return err
	}
	dv, xv := vs[0], vs[1]
	if dv.dt == gpu.F32 && xv.dt == gpu.F32 {
		// In place, in 8-wide vectors where the CPU has AVX2 (the same
		// bits), over spans handed out to the workers: the host adds of
		// offloaded grads (stages' hostAdder) move hundreds of MB.
		spans(b, dv.n, addSpan, func(lo, hi int) {
			o, p := dv.f[lo:hi], xv.f[lo:hi]
			for i := addScaledVector(o, p, s); i < len(o); i++ {
				o[i] += float32(s * p[i])
			}
		})
		return nil
	}
	b.elementwise(dv.n, func(off, l int, bufs [][]float32) {
		p := xv.get(bufs[0], off, l)
		o := dv.get(bufs[1], off, l)
		for i := range o {
			o[i] += float32(s * p[i])
		}
		dv.store(off, o)
	})
	return nil
}

// addSpan is the elements of AddScaled's float32 tasks (256 KiB of dst).
const addSpan = 1 << 16

// AddRMSNorm runs its steps (gpu.AddRMSNormSteps): the CPU backend has no
// fused kernel.
func (b *Backend) AddRMSNorm(sum, dst, rstd, x, y, w gpu.Tensor, eps float32) error {
	if _, _, err := gpu.AddRMSNormDims("add rmsnorm", sum, dst, rstd, x, y, w, eps); err != nil {
		return err
	}
	return gpu.AddRMSNormSteps(b, sum, dst, rstd, x, y, w, eps)
}

// RMSNormBackwardAdd runs its steps (gpu.RMSNormBackwardAddSteps): the CPU
// backend has no fused kernel.
func (b *Backend) RMSNormBackwardAdd(acc, cast, dw, dy, x, w, rstd gpu.Tensor) error {
	if _, _, err := gpu.RMSNormBackwardAddDims("rmsnorm backward add", acc, cast, dw, dy, x, w, rstd); err != nil {
		return err
	}
	return gpu.RMSNormBackwardAddSteps(b, acc, cast, dw, dy, x, w, rstd)
}
