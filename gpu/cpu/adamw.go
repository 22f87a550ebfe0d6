package cpu

import (
	"fmt"
	"math"

	"github.com/rlpipe/rlpipe/gpu"
)

// AdamW performs one torch.optim.AdamW step.
func (b *Backend) AdamW(p, g, m, v gpu.Tensor, st gpu.AdamWStep) error {
	c, a, err := adamwArgs("adamw", p, g, m, v, st)
	if err != nil {
		return err
	}
	spans(b, len(a.p), adamwSpan, func(lo, hi int) {
		c.update(a.p[lo:hi], a.grads(lo, hi), a.m[lo:hi], a.v[lo:hi])
	})
	return nil
}

// AdamWBF16 performs AdamW as AdamW does and writes the updated params,
// rounded to bfloat16 as Copy rounds them, into out (bf16, of p's length),
// each from its register as it is updated, so the copy costs little more
// than its writes. The host keeps such a copy of an offloaded model's fp32
// masters for the device's gathers (stages).
func (b *Backend) AdamWBF16(p, g, m, v, out gpu.Tensor, st gpu.AdamWStep) error {
	const op = "adamw_bf16"
	c, a, err := adamwArgs(op, p, g, m, v, st)
	if err != nil {
		return err
	}
	if out.DType != gpu.BF16 || out.Numel() != p.Numel() {
		return fmt.Errorf("%s: out must be bf16 of p's %d elements, got %v of %d", op, p.Numel(), out.DType, out.Numel())
	}
	for _, t := range []gpu.Named{gpu.Arg("p", p), gpu.Arg("g", g), gpu.Arg("m", m), gpu.Arg("v", v)} {
		if gpu.Overlap(out, t.T) {
			return fmt.Errorf("%s: out overlaps %s", op, t.Name)
		}
	}
	ov, err := floatView(op, "out", out)
	if err != nil {
		return err
	}
	spans(b, len(a.p), adamwSpan, func(lo, hi int) {
		c.updateBF16(a.p[lo:hi], a.grads(lo, hi), a.m[lo:hi], a.v[lo:hi], ov.h[lo:hi])
	})
	return nil
}

// adamwSpan is the elements of one task of the AdamW kernels: 1 MiB of
// each float32 array. The tasks are handed out as workers come free, so a
// worker the OS stops for a while (the host's other threads: the rank's,
// the CUDA driver's) delays the step by a task at most, where equal
// contiguous chunks would wait for its whole chunk.
const adamwSpan = 1 << 18

// adamwArrays are the elements of an AdamW step's four tensors, the
// grads' in their dtype.
type adamwArrays struct {
	p, m, v []float32
	g       fview
}

// grads returns the grads' elements [lo, hi) as float32: their own storage
// for F32, otherwise converted (exactly) into a new slice.
func (a adamwArrays) grads(lo, hi int) []float32 {
	var buf []float32
	if a.g.dt != gpu.F32 {
		buf = make([]float32, hi-lo)
	}
	return a.g.get(buf, lo, hi-lo)
}

// adamwArgs checks an AdamW step's tensors and hyperparameters for op and
// returns the step's constants and the tensors' elements.
func adamwArgs(op string, p, g, m, v gpu.Tensor, st gpu.AdamWStep) (adamwConsts, adamwArrays, error) {
	if err := gpu.CheckAdamW(op, p, g, m, v); err != nil {
		return adamwConsts{}, adamwArrays{}, err
	}
	vs, err := elemCheck(op, []string{"p", "g", "m", "v"}, p, g, m, v)
	if err != nil {
		return adamwConsts{}, adamwArrays{}, err
	}
	if err := st.Check(op); err != nil {
		return adamwConsts{}, adamwArrays{}, err
	}
	return newAdamWConsts(st), adamwArrays{p: vs[0].f, g: vs[1], m: vs[2].f, v: vs[3].f}, nil
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

// updateBF16 is update, writing the updated params' bfloat16 rounding
// (gpu.BF16FromF32) into out, of p's length.
func (c *adamwConsts) updateBF16(p, g, m, v []float32, out []uint16) {
	n := 0
	if c.w1 < 0.5 {
		n = adamwBF16Vector(p, g, m, v, out, c)
	}
	c.scalar(p[n:], g[n:], m[n:], v[n:])
	for i := n; i < len(p); i++ {
		out[i] = gpu.BF16FromF32(p[i])
	}
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
