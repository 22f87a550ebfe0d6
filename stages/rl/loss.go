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
	// RolloutLogP is the rollout engine's log-prob l_rollout,t. It is
	// required when LossConfig.TIS is set; whenever it is given, the
	// rollout/train mismatch metrics are measured.
	RolloutLogP []float32
}

// Output is the result of ComputeLoss.
type Output struct {
	// Loss is the micro-batch's contribution to the mini-batch objective:
	// the sum of Loss over all micro-batches and ranks of a mini-batch is
	// the objective (see Norm for the weights).
	Loss float64
	// Metrics holds the micro-batch's contributions to the logged values;
	// see Metrics.
	Metrics Metrics
	// DLogP is d(DP·Loss)/dl_t, one per token (0 where m_t = 0).
	DLogP []float32
	// DEntropy is d(DP·Loss)/dH_t, one per token; it has length 0 when
	// Batch.Entropy is nil.
	DEntropy []float32
}

// ComputeLoss computes the contribution of one micro-batch to the loss of
// its mini-batch n, the contributions to the logged metrics, and the
// gradients of n.DP times that contribution with respect to every LogP and
// Entropy entry: after the gradients are averaged over the n.DP ranks, the
// optimizer update minimises the mini-batch objective.
//
// The policy term is the ppo clipped surrogate (optionally dual-clipped,
// sequence-level for gspo) or cispo, optionally weighted or masked by
// truncated importance sampling; the terms are aggregated as Norm
// describes. Gradients follow torch autograd exactly, including its rules
// at kinks: max/min ties split the gradient equally between both
// arguments, clamp passes the gradient on the closed range [lo, hi] and
// blocks it outside; detached factors (the cispo ratio, the TIS weight)
// carry no gradient.
//
// The slices of out are reused when their capacity suffices. cfg and n are
// validated; length mismatches, missing inputs and non-finite values at
// unmasked tokens are errors, and out is then unspecified.
func ComputeLoss(cfg LossConfig, b *Batch, n Norm, out *Output) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if b == nil || out == nil {
		return errors.New("compute loss: nil batch or output")
	}
	if err := n.check(len(b.Lengths)); err != nil {
		return err
	}
	sums, err := checkBatch(&cfg, b)
	if err != nil {
		return err
	}
	if err := checkTokenMean(&cfg, n, sums); err != nil {
		return err
	}

	nt := len(b.LogP)
	lc := newLossCtx(&cfg, b, n)
	out.DLogP = zeroed(out.DLogP, nt)
	if lc.useEnt {
		out.DEntropy = zeroed(out.DEntropy, nt)
	} else {
		out.DEntropy = out.DEntropy[:0]
	}

	var met Metrics
	met.Samples = len(b.Lengths)
	if lc.haveRO {
		met.RolloutSamples = len(b.Lengths)
	}
	if cfg.TIS != TISOff {
		met.TISSamples = len(b.Lengths)
	}
	var pgTerm, klTerm, entTerm float64
	start := 0
	for i, length := range b.Lengths {
		end := start + length
		a := b.Advantages[i]
		met.Tokens += sums[i].m
		wt := sampleWeights(&cfg, n, sums[i].m, sums[i].pg)
		// coefSeq is the gspo policy gradient per unit of m'.
		var coefSeq float64
		if lc.gspo {
			// The sequence ratio uses the policy-term mask m'.
			var sd, sw float64
			for t := start; t < end; t++ {
				m := lc.mask(t)
				if m == 0 {
					continue
				}
				if _, w, keep, _ := lc.tisAt(t); keep {
					sd += m * (float64(b.OldLogP[t]) - float64(b.LogP[t]))
					sw += m * w
				}
			}
			den := math.Max(sums[i].pg, 1)
			delta := sd / den
			rho := math.Exp(-delta)
			pg, dpg, clip, dual := policyTerm(rho, a, lc.clipLo, lc.clipHi, cfg.DualClipC)
			pgTerm += wt.pg * sw * pg
			// dρ/dl_t = ρ·m'_t/D'_i.
			coefSeq = wt.pg * sw * dpg * rho / den
			d := wt.diag * sums[i].m
			met.PGClipFrac += d * clip
			met.DualClipFrac += d * dual
			met.PPOKL += d * delta
			met.Ratio += d * rho
		}
		for t := start; t < end; t++ {
			m := lc.mask(t)
			if m == 0 {
				continue
			}
			tt := lc.token(t, a, wt, coefSeq)
			d := wt.diag * m
			if lc.haveRO {
				met.MismatchAbs += d * tt.mismatchAbs
				met.MismatchK3 += d * tt.mismatchK3
				if cfg.TIS != TISOff {
					// The weight applied: w under truncate, 1[kept] under mask.
					met.TISWeight += d * tt.tisW * b2f(tt.keep)
					met.TISClipFrac += d * b2f(tt.over)
				}
			}
			if !lc.gspo {
				pgTerm += tt.pgTerm
				met.PGClipFrac += d * tt.clip
				met.DualClipFrac += d * tt.dual
				met.PPOKL += d * tt.delta
				met.Ratio += d * tt.rho
			}
			klTerm += tt.klTerm
			if lc.useEnt {
				entTerm += tt.entTerm
				out.DEntropy[t] = tt.dent
			}
			out.DLogP[t] = tt.dlogp
		}
		start = end
	}
	loss := pgTerm - cfg.EntropyCoef*entTerm + cfg.KLCoef*klTerm
	met.Loss = loss
	met.PGLoss = pgTerm
	met.KLLoss = klTerm
	met.EntropyLoss = entTerm
	out.Loss = loss
	out.Metrics = met
	return nil
}

// maskSums are a sample's Σ_t m_t and Σ_t m'_t.
type maskSums struct {
	m, pg float64
}

// checkBatch validates b against cfg: lengths, required inputs, and every
// value read at an unmasked token. It returns the mask sums of every
// sample.
func checkBatch(cfg *LossConfig, b *Batch) ([]maskSums, error) {
	n := len(b.LogP)
	if err := checkLen("old_log_probs", b.OldLogP, n); err != nil {
		return nil, err
	}
	useKL := cfg.KL != KLNone
	if useKL {
		if b.RefLogP == nil {
			return nil, fmt.Errorf("compute loss: kl %q needs ref log-probs", cfg.KL)
		}
		if err := checkLen("ref_log_probs", b.RefLogP, n); err != nil {
			return nil, err
		}
	}
	useEnt := b.Entropy != nil
	if cfg.EntropyCoef != 0 && !useEnt {
		return nil, errors.New("compute loss: entropy_coef is set but entropies are missing")
	}
	if useEnt {
		if err := checkLen("entropy", b.Entropy, n); err != nil {
			return nil, err
		}
	}
	if b.Mask != nil {
		if err := checkLen("loss_mask", b.Mask, n); err != nil {
			return nil, err
		}
	}
	if b.RolloutLogP == nil {
		if cfg.TIS != TISOff {
			return nil, fmt.Errorf("compute loss: tis %q needs rollout log-probs", cfg.TIS)
		}
	} else if err := checkLen("rollout_log_probs", b.RolloutLogP, n); err != nil {
		return nil, err
	}
	if len(b.Advantages) != len(b.Lengths) {
		return nil, fmt.Errorf("compute loss: %d advantages for %d samples", len(b.Advantages), len(b.Lengths))
	}
	total := 0
	for i, l := range b.Lengths {
		if l < 0 {
			return nil, fmt.Errorf("compute loss: sample %d has negative length %d", i, l)
		}
		total += l
	}
	if total != n {
		return nil, fmt.Errorf("compute loss: sample lengths sum to %d but there are %d log-probs", total, n)
	}
	capC := cfg.EffectiveTISCap()
	sums := make([]maskSums, len(b.Lengths))
	start := 0
	for i, length := range b.Lengths {
		if a := b.Advantages[i]; !finite(a) {
			return nil, fmt.Errorf("compute loss: advantage of sample %d is %v", i, a)
		}
		for t := start; t < start+length; t++ {
			m := 1.0
			if b.Mask != nil {
				m = float64(b.Mask[t])
			}
			if !finite(m) || m < 0 {
				return nil, fmt.Errorf("compute loss: loss mask %d is %v", t, m)
			}
			if m == 0 {
				continue
			}
			if err := checkToken(b, t, useKL, useEnt); err != nil {
				return nil, err
			}
			sums[i].m += m
			keep := true
			if cfg.TIS != TISOff {
				_, keep, _ = tisToken(cfg.TIS, capC, float64(b.OldLogP[t])-float64(b.RolloutLogP[t]))
			}
			if keep {
				sums[i].pg += m
			}
		}
		start += length
	}
	return sums, nil
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

// klEstimator returns the KL estimator at one token and its derivative with
// respect to l. With unbiased set, the estimator is multiplied by
// w = exp(l − old) and the gradient flows through w (dw/dl = w), as in
// slime. low_var_kl is clamped to [−10, 10] after the weighting; outside
// that range the gradient is 0.
func klEstimator(kind string, unbiased bool, l, old, ref float64) (kl, dkl float64) {
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
	if b.RolloutLogP != nil {
		if v := b.RolloutLogP[t]; !finite(float64(v)) {
			return fmt.Errorf("compute loss: rollout log-prob %d is %v", t, v)
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

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// lossCtx holds what every token's terms read (see ComputeLoss).
type lossCtx struct {
	cfg                                *LossConfig
	b                                  *Batch
	clipLo, clipHi, capC, dp           float64 // the ratio clip range, the tis cap, the dp size
	gspo, cispo, haveRO, useKL, useEnt bool
}

func newLossCtx(cfg *LossConfig, b *Batch, n Norm) *lossCtx {
	return &lossCtx{cfg: cfg, b: b, clipLo: 1 - cfg.EpsClip, clipHi: 1 + cfg.ClipHigh(), capC: cfg.EffectiveTISCap(),
		dp: float64(n.DP), gspo: cfg.Advantage == AdvantageGSPO, cispo: cfg.PolicyLoss == PolicyLossCISPO,
		haveRO: b.RolloutLogP != nil, useKL: cfg.KL != KLNone, useEnt: b.Entropy != nil}
}

// mask returns m_t.
func (lc *lossCtx) mask(t int) float64 {
	if lc.b.Mask == nil {
		return 1
	}
	return float64(lc.b.Mask[t])
}

// tisAt returns x = l_old − l_rollout at token t (0 without rollout
// log-probs) and what truncated importance sampling makes of it (see
// tisToken).
func (lc *lossCtx) tisAt(t int) (x, w float64, keep, over bool) {
	if lc.haveRO {
		x = float64(lc.b.OldLogP[t]) - float64(lc.b.RolloutLogP[t])
	}
	w, keep, over = tisToken(lc.cfg.TIS, lc.capC, x)
	return x, w, keep, over
}

// tokenTerms are one unmasked token's terms: its contributions to the
// loss's terms and metrics (before the sample's diagnostic weight) and its
// gradients.
type tokenTerms struct {
	pgTerm, klTerm, entTerm       float64
	clip, dual, delta, rho        float64
	mismatchAbs, mismatchK3, tisW float64
	keep, over                    bool
	dlogp, dent                   float32
}

// token computes the terms of unmasked token t of a sample with advantage
// a and weights wt; under gspo, coefSeq is the sample's policy gradient
// per unit of m' and the policy term is the sample's (not the token's).
func (lc *lossCtx) token(t int, a float64, wt weights, coefSeq float64) tokenTerms {
	b, cfg := lc.b, lc.cfg
	m := lc.mask(t)
	l := float64(b.LogP[t])
	old := float64(b.OldLogP[t])
	var tt tokenTerms
	x, w, keep, over := lc.tisAt(t)
	tt.tisW, tt.keep, tt.over = w, keep, over
	mp := m // m'_t
	if !keep {
		mp = 0
	}
	if lc.haveRO {
		tt.mismatchAbs, tt.mismatchK3 = mismatch(x)
	}
	var g float64
	if lc.gspo {
		g = mp * coefSeq
	} else {
		delta := old - l
		rho := math.Exp(-delta)
		var pg, dpg float64
		if lc.cispo {
			pg, dpg, tt.clip = cispoTerm(rho, a, l, lc.clipHi)
		} else {
			pg, dpg, tt.clip, tt.dual = policyTerm(rho, a, lc.clipLo, lc.clipHi, cfg.DualClipC)
			dpg *= rho // dρ/dl = ρ
		}
		pw := wt.pg * mp * w
		tt.pgTerm = pw * pg
		g = pw * dpg
		tt.delta, tt.rho = delta, rho
	}
	rw := wt.reg * m
	if lc.useKL {
		kl, dkl := klEstimator(cfg.KL, cfg.KLUnbiased, l, old, float64(b.RefLogP[t]))
		tt.klTerm = rw * kl
		g += cfg.KLCoef * rw * dkl
	}
	if lc.useEnt {
		tt.entTerm = rw * float64(b.Entropy[t])
		if cfg.EntropyCoef != 0 {
			tt.dent = float32(-lc.dp * cfg.EntropyCoef * rw)
		}
	}
	tt.dlogp = float32(lc.dp * g)
	return tt
}

// checkTokenMean checks, under token_mean, that the mini-batch's token
// counts n cover the micro-batch's mask sums.
func checkTokenMean(cfg *LossConfig, n Norm, sums []maskSums) error {
	if cfg.Aggregation != AggTokenMean {
		return nil
	}
	var tok, pgTok float64
	for _, s := range sums {
		tok += s.m
		pgTok += s.pg
	}
	return n.checkTokens(tok, pgTok)
}
