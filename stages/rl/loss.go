package rl

import (
	"errors"
	"fmt"
	"math"
)

// Batch is the per-token and per-sample input of one packed micro-batch.
// Per-token slices hold the response tokens of all samples, flattened in
// sample order: sample i owns the next Lengths[i] entries.
type Batch struct {
	// LogP is the current actor's log-prob l_t of every response token.
	LogP []float32
	// OldLogP is l_old,t: the actor recompute before the step, or the
	// rollout log-probs when LossConfig.UseRolloutLogProbs is set.
	OldLogP []float32
	// RefLogP is the reference model's log-prob l_ref,t. It is required
	// when LossConfig.KL is set and ignored otherwise.
	RefLogP []float32
	// Entropy is the per-token entropy H_t. It is required when
	// LossConfig.EntropyCoef != 0; when given with a zero coefficient it
	// only feeds the entropy_loss metric.
	Entropy []float32
	// Mask is the loss mask m_t (normally 0 or 1; any finite value >= 0
	// is accepted). Nil means all ones. Tokens with m_t = 0 are skipped
	// entirely: their values are not read and their gradients are 0.
	Mask []float32
	// Lengths is the number of response tokens of each sample; the
	// lengths must sum to len(LogP). A length of 0 is allowed.
	Lengths []int
	// Advantages is the per-sample advantage r̂_i (see Advantages).
	Advantages []float64
}

// Metrics holds metric sums of one or more micro-batches. Every field
// except Samples and Tokens is a sum over samples (SM, see docs/rl.md), so
// sums over micro-batches and ranks divided by the global batch size are
// per-sample means; Normalize does that division.
type Metrics struct {
	// Samples is the number of samples summed.
	Samples int
	// Tokens is Σ m_t over all samples.
	Tokens float64
	// Loss is the loss value (unscaled).
	Loss float64
	// PGLoss is the policy-gradient term of the loss: SM(pg), or
	// Σ_i Σ_t m_t pg_t under token_sum aggregation.
	PGLoss float64
	// PGClipFrac is SM(1[clipped branch selected]).
	PGClipFrac float64
	// DualClipFrac is SM(1[dual clip selected]) (rlpipe addition).
	DualClipFrac float64
	// PPOKL is SM(δ) with δ = l_old − l (sequence-level for gspo).
	PPOKL float64
	// Ratio is SM(ρ), ρ = exp(−δ) (rlpipe addition).
	Ratio float64
	// KLLoss is SM(kl), 0 without a KL estimator.
	KLLoss float64
	// EntropyLoss is SM(H), 0 without entropies.
	EntropyLoss float64
}

// Add adds o to m field by field.
func (m *Metrics) Add(o Metrics) {
	m.Samples += o.Samples
	m.Tokens += o.Tokens
	m.Loss += o.Loss
	m.PGLoss += o.PGLoss
	m.PGClipFrac += o.PGClipFrac
	m.DualClipFrac += o.DualClipFrac
	m.PPOKL += o.PPOKL
	m.Ratio += o.Ratio
	m.KLLoss += o.KLLoss
	m.EntropyLoss += o.EntropyLoss
}

// Normalize divides the summed metrics by gbs, the number of samples of
// the optimizer step over all dp ranks, and returns them under their
// logged names: loss, pg_loss, pg_clipfrac, pg_dualclipfrac, ppo_kl,
// ratio, kl_loss and entropy_loss.
func (m Metrics) Normalize(gbs int) (map[string]float64, error) {
	if gbs <= 0 {
		return nil, fmt.Errorf("normalize metrics: global batch size %d must be > 0", gbs)
	}
	d := float64(gbs)
	return map[string]float64{
		"loss":            m.Loss / d,
		"pg_loss":         m.PGLoss / d,
		"pg_clipfrac":     m.PGClipFrac / d,
		"pg_dualclipfrac": m.DualClipFrac / d,
		"ppo_kl":          m.PPOKL / d,
		"ratio":           m.Ratio / d,
		"kl_loss":         m.KLLoss / d,
		"entropy_loss":    m.EntropyLoss / d,
	}, nil
}

// Output is the result of ComputeLoss.
type Output struct {
	// Loss is the unscaled micro-batch loss
	// SM(pg) − c_ent·SM(H) + c_kl·SM(kl) (token_sum: Σ m·pg for the
	// first term).
	Loss float64
	// Metrics holds the metric sums of the micro-batch.
	Metrics Metrics
	// DLogP is d(scale·Loss)/dl_t, one per token (0 where m_t = 0).
	DLogP []float32
	// DEntropy is d(scale·Loss)/dH_t, one per token; it has length 0 when
	// Batch.Entropy is nil.
	DEntropy []float32
}

// ComputeLoss computes the loss of one micro-batch, its metric sums, and
// the gradients of scale·Loss with respect to every LogP and Entropy entry.
//
// The caller passes scale = dp/GBS (dp ranks, GBS samples per optimizer
// step over all ranks): after gradients are averaged over dp, the step
// minimises (1/GBS)·Σ over the step's samples, as in slime. Gradients
// follow torch autograd exactly, including its rules at kinks: max/min
// ties split the gradient equally between both arguments, clamp passes the
// gradient on the closed range [lo, hi] and blocks it outside.
//
// The slices of out are reused when their capacity suffices. cfg is
// validated; length mismatches, missing inputs and non-finite values at
// unmasked tokens are errors.
func ComputeLoss(cfg LossConfig, b *Batch, scale float64, out *Output) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if b == nil || out == nil {
		return errors.New("compute loss: nil batch or output")
	}
	if !finite(scale) {
		return fmt.Errorf("compute loss: scale %v is not finite", scale)
	}
	n := len(b.LogP)
	if err := checkLen("old_log_probs", b.OldLogP, n); err != nil {
		return err
	}
	useKL := cfg.KL != KLNone
	if useKL {
		if b.RefLogP == nil {
			return fmt.Errorf("compute loss: kl %q needs ref log-probs", cfg.KL)
		}
		if err := checkLen("ref_log_probs", b.RefLogP, n); err != nil {
			return err
		}
	}
	useEnt := b.Entropy != nil
	if cfg.EntropyCoef != 0 && !useEnt {
		return errors.New("compute loss: entropy_coef is set but entropies are missing")
	}
	if useEnt {
		if err := checkLen("entropy", b.Entropy, n); err != nil {
			return err
		}
	}
	if b.Mask != nil {
		if err := checkLen("loss_mask", b.Mask, n); err != nil {
			return err
		}
	}
	if len(b.Advantages) != len(b.Lengths) {
		return fmt.Errorf("compute loss: %d advantages for %d samples", len(b.Advantages), len(b.Lengths))
	}
	total := 0
	for i, l := range b.Lengths {
		if l < 0 {
			return fmt.Errorf("compute loss: sample %d has negative length %d", i, l)
		}
		total += l
	}
	if total != n {
		return fmt.Errorf("compute loss: sample lengths sum to %d but there are %d log-probs", total, n)
	}

	out.DLogP = zeroed(out.DLogP, n)
	if useEnt {
		out.DEntropy = zeroed(out.DEntropy, n)
	} else {
		out.DEntropy = out.DEntropy[:0]
	}

	lo, hi := 1-cfg.EpsClip, 1+cfg.ClipHigh()
	gspo := cfg.Advantage == AdvantageGSPO
	tokenSum := cfg.Aggregation == AggTokenSum
	mask := func(t int) float64 {
		if b.Mask == nil {
			return 1
		}
		return float64(b.Mask[t])
	}

	var met Metrics
	met.Samples = len(b.Lengths)
	var pgTerm, klSM, entSM float64
	start := 0
	for i, length := range b.Lengths {
		end := start + length
		a := b.Advantages[i]
		if !finite(a) {
			return fmt.Errorf("compute loss: advantage of sample %d is %v", i, a)
		}
		// Validate the sample's tokens and compute its mask sum.
		var sumM float64
		for t := start; t < end; t++ {
			m := mask(t)
			if !finite(m) || m < 0 {
				return fmt.Errorf("compute loss: loss mask %d is %v", t, m)
			}
			if m == 0 {
				continue
			}
			sumM += m
			if err := checkToken(b, t, useKL, useEnt); err != nil {
				return err
			}
		}
		met.Tokens += sumM
		den := math.Max(sumM, 1)
		// coefSeq is the per-unit-mask gradient of the gspo policy term.
		var coefSeq float64
		if gspo {
			var s float64
			for t := start; t < end; t++ {
				if m := mask(t); m != 0 {
					s += m * (float64(b.OldLogP[t]) - float64(b.LogP[t]))
				}
			}
			delta := s / den
			rho := math.Exp(-delta)
			pg, dpg, clip, dual := policyTerm(rho, a, lo, hi, cfg.DualClipC)
			wSM := sumM / den // Σ_t m_t/den
			wPG := wSM
			if tokenSum {
				wPG = sumM
			}
			pgTerm += wPG * pg
			met.PGClipFrac += wSM * clip
			met.DualClipFrac += wSM * dual
			met.PPOKL += wSM * delta
			met.Ratio += wSM * rho
			// dρ/dl_t = ρ·m_t/den.
			coefSeq = wPG * dpg * rho / den
		}
		for t := start; t < end; t++ {
			m := mask(t)
			if m == 0 {
				continue
			}
			w := m / den
			l := float64(b.LogP[t])
			old := float64(b.OldLogP[t])
			var g float64
			if gspo {
				g = m * coefSeq
			} else {
				delta := old - l
				rho := math.Exp(-delta)
				pg, dpg, clip, dual := policyTerm(rho, a, lo, hi, cfg.DualClipC)
				wPG := w
				if tokenSum {
					wPG = m
				}
				pgTerm += wPG * pg
				g = wPG * dpg * rho // dρ/dl = ρ
				met.PGClipFrac += w * clip
				met.DualClipFrac += w * dual
				met.PPOKL += w * delta
				met.Ratio += w * rho
			}
			if useKL {
				kl, dkl := klTerm(cfg.KL, cfg.KLUnbiased, l, old, float64(b.RefLogP[t]))
				klSM += w * kl
				g += cfg.KLCoef * w * dkl
			}
			if useEnt {
				entSM += w * float64(b.Entropy[t])
				if cfg.EntropyCoef != 0 {
					out.DEntropy[t] = float32(-scale * cfg.EntropyCoef * w)
				}
			}
			out.DLogP[t] = float32(scale * g)
		}
		start = end
	}
	loss := pgTerm - cfg.EntropyCoef*entSM + cfg.KLCoef*klSM
	met.Loss = loss
	met.PGLoss = pgTerm
	met.KLLoss = klSM
	met.EntropyLoss = entSM
	out.Loss = loss
	out.Metrics = met
	return nil
}

// policyTerm returns the per-token clipped policy loss pg(ρ) for advantage
// a, its derivative with respect to ρ under torch's autograd rules, and the
// clip and dual-clip indicators.
func policyTerm(rho, a, lo, hi, c float64) (pg, dpg, clip, dual float64) {
	pg1 := -rho * a
	clamped := math.Min(math.Max(rho, lo), hi)
	pg2 := -clamped * a
	g1 := -a
	g2 := 0.0
	if rho >= lo && rho <= hi {
		g2 = -a
	}
	// torch.maximum(pg1, pg2).
	switch {
	case pg1 > pg2:
		pg, dpg = pg1, g1
	case pg1 < pg2:
		pg, dpg, clip = pg2, g2, 1
	default:
		pg, dpg = pg1, (g1+g2)/2
	}
	// torch.where(a < 0, torch.min(-c·a, pg), pg).
	if c > 0 && a < 0 {
		pg3 := -c * a
		switch {
		case pg3 < pg:
			pg, dpg, dual = pg3, 0, 1
		case pg3 == pg:
			dpg /= 2
		}
	}
	return pg, dpg, clip, dual
}

// klTerm returns the KL estimator at one token and its derivative with
// respect to l. With unbiased set, the estimator is multiplied by
// w = exp(l − old) and the gradient flows through w (dw/dl = w), as in
// slime. low_var_kl is clamped to [−10, 10] after the weighting; outside
// that range the gradient is 0.
func klTerm(kind string, unbiased bool, l, old, ref float64) (kl, dkl float64) {
	x := l - ref
	switch kind {
	case KLK1:
		kl, dkl = x, 1
	case KLK2:
		kl, dkl = x*x/2, x
	default: // k3, low_var_kl
		e := math.Exp(-x)
		kl, dkl = e-1+x, 1-e
	}
	if unbiased {
		w := math.Exp(l - old)
		kl, dkl = w*kl, w*dkl+w*kl
	}
	if kind == KLLowVarKL {
		switch {
		case kl > lowVarKLClamp:
			kl, dkl = lowVarKLClamp, 0
		case kl < -lowVarKLClamp:
			kl, dkl = -lowVarKLClamp, 0
		}
	}
	return kl, dkl
}

func checkToken(b *Batch, t int, useKL, useEnt bool) error {
	if v := b.LogP[t]; !finite(float64(v)) {
		return fmt.Errorf("compute loss: log-prob %d is %v", t, v)
	}
	if v := b.OldLogP[t]; !finite(float64(v)) {
		return fmt.Errorf("compute loss: old log-prob %d is %v", t, v)
	}
	if useKL {
		if v := b.RefLogP[t]; !finite(float64(v)) {
			return fmt.Errorf("compute loss: ref log-prob %d is %v", t, v)
		}
	}
	if useEnt {
		if v := b.Entropy[t]; !finite(float64(v)) {
			return fmt.Errorf("compute loss: entropy %d is %v", t, v)
		}
	}
	return nil
}

func checkLen(name string, s []float32, n int) error {
	if len(s) != n {
		return fmt.Errorf("compute loss: %s has %d entries but log_probs has %d", name, len(s), n)
	}
	return nil
}

func zeroed(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	s = s[:n]
	clear(s)
	return s
}
