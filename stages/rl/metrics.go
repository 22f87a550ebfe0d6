package rl

import "math"

// Metrics holds the logged values of one or more micro-batches.
//
// Samples, Tokens, RolloutSamples and TISSamples are plain counts. Every
// other field is a normalised contribution: ComputeLoss divides by the
// mini-batch's normalisers (see Norm), so the sum of a field over all
// micro-batches and ranks of a mini-batch is the mini-batch's logged value
// itself, with no later division.
//
// Loss, PGLoss, KLLoss and EntropyLoss are the terms of the objective,
// aggregated as LossConfig.Aggregation says. The diagnostics (PGClipFrac,
// DualClipFrac, PPOKL, Ratio and the mismatch and TIS fields) are always
// per-sample means with the loss mask m, whatever the aggregation: a
// sample i contributes Σ_t (m_t/D_i)·x_t / B, with D_i = max(Σ_t m_t, 1)
// and B = Norm.Samples.
type Metrics struct {
	// Samples is the number of samples summed.
	Samples int
	// Tokens is Σ m_t over all samples summed.
	Tokens float64
	// RolloutSamples is the number of samples summed whose rollout
	// log-probs were given, so that MismatchAbs and MismatchK3 were
	// measured.
	RolloutSamples int
	// TISSamples is the number of samples summed with truncated
	// importance sampling on, so that TISWeight and TISClipFrac were
	// measured.
	TISSamples int
	// Loss is the value of the objective.
	Loss float64
	// PGLoss is the policy-gradient term of the objective.
	PGLoss float64
	// PGClipFrac is the mean of the clip indicator: 1 where the clipped
	// branch of the ppo surrogate is selected, or where ρ > 1 + ε_high
	// under cispo.
	PGClipFrac float64
	// DualClipFrac is the mean of 1[dual clip selected] (rlpipe addition).
	DualClipFrac float64
	// PPOKL is the mean of δ = l_old − l (sequence-level for gspo).
	PPOKL float64
	// Ratio is the mean of ρ = exp(−δ) (rlpipe addition).
	Ratio float64
	// KLLoss is the KL term of the objective before kl_coef; 0 without
	// a KL estimator.
	KLLoss float64
	// EntropyLoss is the entropy term of the objective before
	// entropy_coef; 0 without entropies.
	EntropyLoss float64
	// MismatchAbs is the mean of |x|, x = l_old − l_rollout.
	MismatchAbs float64
	// MismatchK3 is the mean of the k3 estimator exp(−x) − 1 + x of
	// KL(rollout ‖ old) at the rollout's tokens.
	MismatchK3 float64
	// TISWeight is the mean of the weight TIS applies to a token's policy
	// term: min(exp(x), C) under truncate, 1[exp(x) ≤ C] under mask.
	TISWeight float64
	// TISClipFrac is the mean of 1[exp(x) > C].
	TISClipFrac float64
}

// Add adds o to m field by field.
func (m *Metrics) Add(o Metrics) {
	m.Samples += o.Samples
	m.Tokens += o.Tokens
	m.RolloutSamples += o.RolloutSamples
	m.TISSamples += o.TISSamples
	m.Loss += o.Loss
	m.PGLoss += o.PGLoss
	m.PGClipFrac += o.PGClipFrac
	m.DualClipFrac += o.DualClipFrac
	m.PPOKL += o.PPOKL
	m.Ratio += o.Ratio
	m.KLLoss += o.KLLoss
	m.EntropyLoss += o.EntropyLoss
	m.MismatchAbs += o.MismatchAbs
	m.MismatchK3 += o.MismatchK3
	m.TISWeight += o.TISWeight
	m.TISClipFrac += o.TISClipFrac
}

// fields lists m's fields in a fixed order, the counts as float64 copies.
func (m *Metrics) fields() []*float64 {
	return []*float64{&m.Tokens, &m.Loss, &m.PGLoss, &m.PGClipFrac, &m.DualClipFrac, &m.PPOKL, &m.Ratio,
		&m.KLLoss, &m.EntropyLoss, &m.MismatchAbs, &m.MismatchK3, &m.TISWeight, &m.TISClipFrac}
}

// MetricsLen is the length of Metrics.Vector.
const MetricsLen = 16

// Vector returns every field of m, counts included, in a fixed order of
// MetricsLen values: summing the vectors of several ranks (an all-reduce)
// and converting back with MetricsFromVector gives their Add.
func (m Metrics) Vector() []float64 {
	v := []float64{float64(m.Samples), float64(m.RolloutSamples), float64(m.TISSamples)}
	for _, f := range m.fields() {
		v = append(v, *f)
	}
	return v
}

// MetricsFromVector is the inverse of Metrics.Vector; the counts are
// rounded to the nearest integer (a float32 all-reduce sums them exactly
// up to 2^24).
func MetricsFromVector(v []float64) Metrics {
	var m Metrics
	if len(v) != MetricsLen {
		return m
	}
	m.Samples, m.RolloutSamples, m.TISSamples = int(math.Round(v[0])), int(math.Round(v[1])), int(math.Round(v[2]))
	for i, f := range m.fields() {
		*f = v[3+i]
	}
	return m
}

// Values returns the metrics under their logged names: loss, pg_loss,
// pg_clipfrac, pg_dualclipfrac, ppo_kl, ratio, kl_loss and entropy_loss
// always; mismatch_abs and mismatch_k3 when RolloutSamples > 0; tis_weight
// and tis_clipfrac when TISSamples > 0. The values are the fields as they
// are: for a sum over a whole mini-batch they are its logged values. The
// mismatch values are per-sample means over the mini-batch when every
// sample had rollout log-probs (TIS requires them everywhere).
func (m Metrics) Values() map[string]float64 {
	v := map[string]float64{
		"loss":            m.Loss,
		"pg_loss":         m.PGLoss,
		"pg_clipfrac":     m.PGClipFrac,
		"pg_dualclipfrac": m.DualClipFrac,
		"ppo_kl":          m.PPOKL,
		"ratio":           m.Ratio,
		"kl_loss":         m.KLLoss,
		"entropy_loss":    m.EntropyLoss,
	}
	if m.RolloutSamples > 0 {
		v["mismatch_abs"] = m.MismatchAbs
		v["mismatch_k3"] = m.MismatchK3
	}
	if m.TISSamples > 0 {
		v["tis_weight"] = m.TISWeight
		v["tis_clipfrac"] = m.TISClipFrac
	}
	return v
}
