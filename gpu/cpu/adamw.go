package cpu

import (
	"math"

	"github.com/rlpipe/rlpipe/gpu"
)

// AdamW performs one torch.optim.AdamW step.
func (b *Backend) AdamW(p, g, m, v gpu.Tensor, st gpu.AdamWStep) error {
	const op = "adamw"
	if err := gpu.CheckAdamW(op, p, g, m, v); err != nil {
		return err
	}
	vs, err := elemCheck(op, []string{"p", "g", "m", "v"}, p, g, m, v)
	if err != nil {
		return err
	}
	if err := st.Check(op); err != nil {
		return err
	}
	c := newAdamWConsts(st)
	pf, gf, mf, vf := vs[0].f, vs[1].f, vs[2].f, vs[3].f
	b.parallel(len(pf), 1<<14, func(_, lo, hi int) {
		c.update(pf[lo:hi], gf[lo:hi], mf[lo:hi], vf[lo:hi])
	})
	return nil
}

// adamwConsts are the float32 constants of one AdamW step, in the layout
// the vector kernel reads (adamw_amd64.s).
type adamwConsts struct {
	decay, gradScale, w1, b2, w2, stepSize, bc2Sqrt, eps float32
}

// newAdamWConsts forms the step's constants as torch does: Python-float
// scalars, then cast to float32 for the float32 kernels.
func newAdamWConsts(st gpu.AdamWStep) adamwConsts {
	bc1 := 1 - math.Pow(st.Beta1, float64(st.Step))
	bc2 := 1 - math.Pow(st.Beta2, float64(st.Step))
	return adamwConsts{
		decay:     float32(1 - st.LR*st.WeightDecay),
		gradScale: st.Scale(),
		w1:        float32(1 - st.Beta1),
		b2:        float32(st.Beta2),
		w2:        float32(1 - st.Beta2),
		stepSize:  float32(-(st.LR / bc1)),
		bc2Sqrt:   float32(math.Sqrt(bc2)),
		eps:       float32(st.Eps),
	}
}

// update takes the step over p, g, m and v (of one length): with the
// vector kernel where the CPU has one, the rest in Go. Both give the same
// bits: the same float32 operations in the same order, no fused
// multiply-adds, and a float32 square root is correctly rounded either way.
func (c *adamwConsts) update(p, g, m, v []float32) {
	n := 0
	if c.w1 < 0.5 {
		n = adamwVector(p, g, m, v, c)
	}
	c.scalar(p[n:], g[n:], m[n:], v[n:])
}

// scalar is the step in Go, in torch's order of operations.
func (c *adamwConsts) scalar(p, g, m, v []float32) {
	g, m, v = g[:len(p)], m[:len(p)], v[:len(p)]
	for i, pi := range p {
		x := pi * c.decay
		gi := g[i] * c.gradScale
		mo := m[i]
		mi := mo + float32(c.w1*(gi-mo)) // torch's lerp with a weight below 0.5
		if c.w1 >= 0.5 {
			mi = gi - float32((gi-mo)*(1-c.w1))
		}
		vi := float32(v[i]*c.b2) + float32(float32(c.w2*gi)*gi)
		den := float32(float32(math.Sqrt(float64(vi)))/c.bc2Sqrt) + c.eps
		x += float32(c.stepSize*mi) / den
		p[i], m[i], v[i] = x, mi, vi
	}
}
