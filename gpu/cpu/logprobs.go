package cpu

import (
	"math"

	"github.com/rlpipe/rlpipe/gpu"
)

// lpArgs are the checked operands of LogProbs and LogProbsBackward.
type lpArgs struct {
	c, hd, v   int
	h, w       fview
	logits     []float32
	targets    []int32
	invT       float32
	temp       float32
	tempered   bool
	hasEntropy bool
}

func (b *Backend) lpCheck(op string, entropy, h, w, targets gpu.Tensor, temperature float32, entropyTempered bool, logits gpu.Tensor) (lpArgs, error) {
	var a lpArgs
	var err error
	if a.c, a.hd, a.v, a.hasEntropy, err = gpu.LogProbsDims(op, entropy, h, w, targets, temperature, logits); err != nil {
		return a, err
	}
	if a.h, err = floatView(op, "h", h); err != nil {
		return a, err
	}
	if a.w, err = floatView(op, "w", w); err != nil {
		return a, err
	}
	if a.logits, err = f32View(op, "logits", logits); err != nil {
		return a, err
	}
	if a.targets, err = i32View(op, "targets", targets); err != nil {
		return a, err
	}
	if err := checkIDs(op, "targets", a.targets, a.v); err != nil {
		return a, err
	}
	a.temp, a.invT, a.tempered = temperature, 1/temperature, entropyTempered
	return a, nil
}

// rowStats are the softmax statistics of one row: for the tempered logits
// z = l/T, their max and log-sum-exp; for the entropy's logits u (z or l),
// log-sum-exp and the mean of u under softmax(u).
type rowStats struct {
	lseZ, lseU, meanU float64
}

// stats computes the statistics of row l.
func (a *lpArgs) stats(l []float32, entropy bool) rowStats {
	var st rowStats
	mz := math.Inf(-1)
	for _, x := range l {
		mz = math.Max(mz, float64(x/a.temp))
	}
	s := 0.0
	for _, x := range l {
		s += math.Exp(float64(x/a.temp) - mz)
	}
	st.lseZ = mz + math.Log(s)
	if !entropy {
		return st
	}
	if a.tempered || a.temp == 1 {
		st.lseU = st.lseZ
		e := 0.0
		for _, x := range l {
			z := float64(x / a.temp)
			e += math.Exp(z-st.lseZ) * z
		}
		st.meanU = e
		return st
	}
	mu := math.Inf(-1)
	for _, x := range l {
		mu = math.Max(mu, float64(x))
	}
	s, e := 0.0, 0.0
	for _, x := range l {
		p := math.Exp(float64(x) - mu)
		s += p
		e += p * float64(x)
	}
	st.lseU = mu + math.Log(s)
	st.meanU = e / s
	return st
}

// u returns the entropy's logit for raw logit x.
func (a *lpArgs) u(x float32) float64 {
	if a.tempered {
		return float64(x / a.temp)
	}
	return float64(x)
}

// LogProbs computes per-token log-probs (and optionally entropies) for a
// chunk of hidden states.
//
// The CPU leaves a statistics workspace (stats) as it is: its
// LogitsBackward computes the statistics again.
func (b *Backend) LogProbs(logp, entropy, h, w, targets gpu.Tensor, temperature float32, entropyTempered bool, logits, stats gpu.Tensor) error {
	const op = "logprobs"
	a, err := b.lpCheck(op, entropy, h, w, targets, temperature, entropyTempered, logits)
	if err != nil {
		return err
	}
	if err := gpu.CheckLogProbs(op, logp, entropy, h, w, targets, logits, a.c, a.hasEntropy); err != nil {
		return err
	}
	if err := gpu.CheckLogProbsStats(op, stats, a.c, gpu.Arg("logp", logp), gpu.Arg("entropy", entropy), gpu.Arg("h", h),
		gpu.Arg("w", w), gpu.Arg("targets", targets), gpu.Arg("logits", logits)); err != nil {
		return err
	}
	lp, err := f32View(op, "logp", logp)
	if err != nil {
		return err
	}
	var ent []float32
	if a.hasEntropy {
		if ent, err = f32View(op, "entropy", entropy); err != nil {
			return err
		}
	}
	b.gemm(mat{fview{dt: gpu.F32, f: a.logits, n: len(a.logits)}, a.c, a.v}, mat{a.h, a.c, a.hd}, mat{a.w, a.v, a.hd}, false, true, 1, 0)
	b.parallel(a.c, 1, func(_, lo, hi int) {
		for r := lo; r < hi; r++ {
			l := a.logits[r*a.v : (r+1)*a.v]
			st := a.stats(l, a.hasEntropy)
			lp[r] = float32(float64(l[a.targets[r]]/a.temp) - st.lseZ)
			if a.hasEntropy {
				ent[r] = float32(st.lseU - st.meanU)
			}
		}
	})
	return nil
}

// LogProbsBackward computes dh and accumulates dw for LogProbs.
func (b *Backend) LogProbsBackward(dh, dw, dlogp, dentropy, h, w, targets gpu.Tensor, temperature float32, entropyTempered bool, logits gpu.Tensor) error {
	return b.lpBackward("logprobs backward", true, dh, dw, dlogp, dentropy, h, w, targets, temperature, entropyTempered, logits, gpu.Tensor{})
}

// LogitsBackward is LogProbsBackward on the logits LogProbs left in the
// workspace: it skips their recomputation. It checks stats and computes
// the rows' statistics again.
func (b *Backend) LogitsBackward(dh, dw, dlogp, dentropy, h, w, targets gpu.Tensor, temperature float32, entropyTempered bool, logits, stats gpu.Tensor) error {
	return b.lpBackward("logits backward", false, dh, dw, dlogp, dentropy, h, w, targets, temperature, entropyTempered, logits, stats)
}

// lpBackward is LogProbsBackward (recompute true) or LogitsBackward.
func (b *Backend) lpBackward(op string, recompute bool, dh, dw, dlogp, dentropy, h, w, targets gpu.Tensor, temperature float32, entropyTempered bool, logits, stats gpu.Tensor) error {
	a, err := b.lpCheck(op, dentropy, h, w, targets, temperature, entropyTempered, logits)
	if err != nil {
		return err
	}
	if err := gpu.CheckLogProbsBackward(op, dh, dw, dlogp, dentropy, h, w, targets, logits, a.c, a.hd, a.v); err != nil {
		return err
	}
	if err := gpu.CheckLogProbsStats(op, stats, a.c, gpu.Arg("dh", dh), gpu.Arg("dw", dw), gpu.Arg("dlogp", dlogp),
		gpu.Arg("dentropy", dentropy), gpu.Arg("h", h), gpu.Arg("w", w), gpu.Arg("targets", targets), gpu.Arg("logits", logits)); err != nil {
		return err
	}
	withDW := dw.Mem != nil
	g, err := f32View(op, "dlogp", dlogp)
	if err != nil {
		return err
	}
	var ge []float32
	if a.hasEntropy {
		if ge, err = f32View(op, "dentropy", dentropy); err != nil {
			return err
		}
	}
	dhv, err := floatView(op, "dh", dh)
	if err != nil {
		return err
	}
	var dwv fview
	if withDW {
		if dwv, err = floatView(op, "dw", dw); err != nil {
			return err
		}
	}
	lm := mat{fview{dt: gpu.F32, f: a.logits, n: len(a.logits)}, a.c, a.v}
	if recompute {
		b.gemm(lm, mat{a.h, a.c, a.hd}, mat{a.w, a.v, a.hd}, false, true, 1, 0)
	}
	tau := 1.0
	if a.tempered {
		tau = 1 / float64(a.temp)
	}
	b.parallel(a.c, 1, func(_, lo, hi int) {
		for r := lo; r < hi; r++ {
			l := a.logits[r*a.v : (r+1)*a.v]
			withEnt := a.hasEntropy && ge[r] != 0
			st := a.stats(l, withEnt)
			gl := float64(g[r]) / float64(a.temp)
			var gh float64
			if withEnt {
				gh = float64(ge[r]) * tau
			}
			y := int(a.targets[r])
			for j, x := range l {
				p := math.Exp(float64(x/a.temp) - st.lseZ)
				d := -gl * p
				if j == y {
					d += gl
				}
				if withEnt {
					u := a.u(x)
					d -= gh * math.Exp(u-st.lseU) * (u - st.meanU)
				}
				l[j] = float32(d)
			}
		}
	})
	b.gemm(mat{dhv, a.c, a.hd}, lm, mat{a.w, a.v, a.hd}, false, false, 1, 0)
	if withDW {
		b.gemm(mat{dwv, a.v, a.hd}, lm, mat{a.h, a.c, a.hd}, true, false, 1, 1)
	}
	return nil
}
