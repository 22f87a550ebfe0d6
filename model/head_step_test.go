package model

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// TestHeadStep checks that HeadStep equals HeadForward then HeadBackward
// bit for bit (log-probs, entropies, the rows' and the head's gradients),
// with a gradient that depends on each token's log-prob and entropy, over
// chunks that do not divide the rows, with and without an entropy term.
func TestHeadStep(t *testing.T) {
	const n, h, v, chunk = 11, 32, 72, 4
	for _, tb := range testBackends {
		for _, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
			for _, withEnt := range []bool{true, false} {
				name := tb.name + "/" + dt.String()
				if !withEnt {
					name += "/no-entropy"
				}
				t.Run(name, func(t *testing.T) { headStepCase(t, tb.new(t), dt, withEnt, n, h, v, chunk) })
			}
		}
	}
}

func headStepCase(t *testing.T, b gpu.Backend, dt gpu.DType, withEnt bool, n, h, v, chunk int) {
	a := newTestArena(t, b, 8<<20)
	r := rand.New(rand.NewPCG(3, 4))
	rnd := func(k int, scale float64) []float32 {
		x := make([]float32, k)
		for i := range x {
			x[i] = float32(r.NormFloat64() * scale)
		}
		return x
	}
	typed := func(vals []float32, shape ...int) gpu.Tensor {
		x := a.tensor(dt, shape...)
		if err := b.Upload(x, vals); err != nil {
			t.Fatal(err)
		}
		return x
	}
	c := &Config{RMSNormEps: 1e-6, VocabSize: v, HiddenSize: h}
	norm := rnd(h, 0.1)
	for i := range norm {
		norm[i]++
	}
	w := HeadWeights{Norm: typed(norm, h), LMHead: typed(rnd(v*h, 0.3), v, h)}
	rowsData := rnd(n*h, 1)
	targets := make([]int32, n)
	for i := range targets {
		targets[i] = int32(r.IntN(v))
	}
	// grad is the loss gradient the test uses: it depends on the token's
	// log-prob and entropy, as a token-level loss's does.
	grad := func(lp, ent float32, i int) (float32, float32) {
		g := float32(math.Exp(float64(lp))) * float32(i%3-1)
		if !withEnt {
			return g, 0
		}
		return g, 0.05 * ent
	}
	type result struct{ logp, ent, dxn, drows, dlm, dnorm []float32 }
	run := func(step bool) result {
		rows := a.f32(rowsData)
		rows.Shape = []int{n, h}
		xn, rstd := a.tensor(dt, n, h), a.tensor(gpu.F32, n)
		tg := a.i32(targets)
		logp, dlogp := a.tensor(gpu.F32, n), a.tensor(gpu.F32, n)
		var ent, dent gpu.Tensor
		if withEnt {
			ent, dent = a.tensor(gpu.F32, n), a.tensor(gpu.F32, n)
		}
		dxn, drows := a.tensor(dt, n, h), a.tensor(gpu.F32, n, h)
		dw := HeadWeights{Norm: a.tensor(dt, h), LMHead: a.tensor(dt, v, h)}
		for _, x := range []gpu.Tensor{dw.Norm, dw.LMHead} {
			if err := b.Zero(x); err != nil {
				t.Fatal(err)
			}
		}
		logits := a.tensor(gpu.F32, chunk, v)
		s := Sampling{Temperature: 1}
		// gradsOf writes the gradients of rows [lo,hi) from their log-probs.
		gradsOf := func(lo, hi int) error {
			lp := a.down(logp)
			var en []float32
			if withEnt {
				en = a.down(ent)
			}
			gl, ge := a.down(dlogp), make([]float32, n)
			if withEnt {
				ge = a.down(dent)
			}
			for i := lo; i < hi; i++ {
				var e float32
				if withEnt {
					e = en[i]
				}
				gl[i], ge[i] = grad(lp[i], e, i)
			}
			if err := b.Upload(dlogp, gl); err != nil {
				return err
			}
			if withEnt {
				return b.Upload(dent, ge)
			}
			return nil
		}
		if step {
			stats := a.tensor(gpu.F32, chunk, gpu.LogProbsStatsCols)
			if err := c.HeadStep(b, w, dw, rows, xn, rstd, tg, logp, ent, dlogp, dent, dxn, drows, logits, stats, chunk, s, gradsOf); err != nil {
				t.Fatal(err)
			}
		} else {
			if err := c.HeadForward(b, w, rows, xn, rstd, tg, logp, ent, logits, chunk, s); err != nil {
				t.Fatal(err)
			}
			if err := gradsOf(0, n); err != nil {
				t.Fatal(err)
			}
			if err := c.HeadBackward(b, w, dw, rows, xn, rstd, tg, dlogp, dent, dxn, drows, logits, chunk, s); err != nil {
				t.Fatal(err)
			}
		}
		res := result{logp: a.down(logp), dxn: a.down(dxn), drows: a.down(drows), dlm: a.down(dw.LMHead), dnorm: a.down(dw.Norm)}
		if withEnt {
			res.ent = a.down(ent)
		}
		return res
	}
	want, got := run(false), run(true)
	same := func(name string, x, y []float32) {
		t.Helper()
		nonzero := false
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
				t.Fatalf("%s[%d]: HeadStep %v, HeadForward+HeadBackward %v", name, i, y[i], x[i])
			}
			nonzero = nonzero || x[i] != 0
		}
		if !nonzero && len(x) > 0 {
			t.Fatalf("%s is all zero: the comparison shows nothing", name)
		}
	}
	same("logp", want.logp, got.logp)
	same("entropy", want.ent, got.ent)
	same("dxn", want.dxn, got.dxn)
	same("drows", want.drows, got.drows)
	same("d lm_head", want.dlm, got.dlm)
	same("d norm", want.dnorm, got.dnorm)
}
