package rl

import (
	"fmt"
	"math"
)

// Norm describes the mini-batch (one optimizer update) that a micro-batch
// belongs to: the normalisers of the mini-batch objective, which span all
// its micro-batches on all data-parallel ranks.
//
// With m the loss mask, m' the policy-term mask (m, except that TIS mask
// mode zeroes some tokens; see LossConfig.PGMask), D_i = max(Σ_t m_t, 1),
// D'_i = max(Σ_t m'_t, 1), B = Samples, N = Tokens, N' = PGTokens and
// L = LossConfig.LossNormLen, a token of sample i has these weights:
//
//	aggregation               policy term       KL and entropy terms
//	sample_mean               m'_t/(D'_i·B)     m_t/(D_i·B)
//	token_sum                 m'_t/B            m_t/(D_i·B)
//	token_mean                m'_t/max(N',1)    m_t/max(N,1)
//	seq_mean_token_sum_norm   m'_t/(B·L)        m_t/(B·L)
//
// and the objective is Σ pg-weight·pg − c_ent·Σ weight·H + c_kl·Σ weight·kl
// over every token of the mini-batch.
type Norm struct {
	// DP is the number of ranks over which gradients are averaged after
	// backward: the data-parallel ranks, or with context parallelism all
	// dp × cp ranks (each cp rank's grads are a part of its group's sum).
	// It must be > 0.
	DP int
	// Samples is B, the number of samples of the mini-batch over all
	// ranks (the global batch size). It must be > 0 and at least the
	// micro-batch's sample count.
	Samples int
	// Tokens is N = Σ_i Σ_t m_t over every sample of the mini-batch on
	// all ranks (all-reduced before the first backward). It is read only
	// by token_mean, which checks that it covers the micro-batch's own
	// tokens; it must be finite and >= 0.
	Tokens float64
	// PGTokens is N', the same sum with the policy-term mask m' (equal
	// to Tokens unless tis is mask). It is read only by token_mean, like
	// Tokens; LossConfig.TokenCounts computes both.
	PGTokens float64
}

// tokenSlack is the relative slack allowed when checking that Norm's token
// counts cover a micro-batch's own (the caller may sum in another order or
// in float32).
const tokenSlack = 1e-6

// check validates n for a micro-batch of samples samples.
func (n Norm) check(samples int) error {
	if n.DP <= 0 {
		return fmt.Errorf("compute loss: norm dp %d must be > 0", n.DP)
	}
	if n.Samples <= 0 || n.Samples < samples {
		return fmt.Errorf("compute loss: norm samples %d must be > 0 and cover the micro-batch's %d samples", n.Samples, samples)
	}
	if !finite(n.Tokens) || n.Tokens < 0 {
		return fmt.Errorf("compute loss: norm tokens %v must be finite and >= 0", n.Tokens)
	}
	if !finite(n.PGTokens) || n.PGTokens < 0 {
		return fmt.Errorf("compute loss: norm pg tokens %v must be finite and >= 0", n.PGTokens)
	}
	return nil
}

// checkTokens reports an error when token_mean's normalisers are smaller
// than the micro-batch's own mask sums: they must count the whole
// mini-batch.
func (n Norm) checkTokens(tokens, pgTokens float64) error {
	if tokens-n.Tokens > tokenSlack*math.Max(tokens, 1) {
		return fmt.Errorf("compute loss: norm tokens %v is less than the micro-batch's %v loss-mask tokens (token_mean needs the mini-batch total)", n.Tokens, tokens)
	}
	if pgTokens-n.PGTokens > tokenSlack*math.Max(pgTokens, 1) {
		return fmt.Errorf("compute loss: norm pg tokens %v is less than the micro-batch's %v policy-term tokens (token_mean needs the mini-batch total)", n.PGTokens, pgTokens)
	}
	return nil
}

// weights are the per-unit-mask weights of one sample's tokens: a token
// with loss mask m and policy mask m' has policy weight m'·pg, KL and
// entropy weight m·reg and diagnostic weight m·diag.
type weights struct {
	pg, reg, diag float64
}

// sampleWeights returns the weights of a sample whose mask sums are sumM
// (Σ m) and sumPG (Σ m').
func sampleWeights(cfg *LossConfig, n Norm, sumM, sumPG float64) weights {
	b := float64(n.Samples)
	w := weights{diag: 1 / (math.Max(sumM, 1) * b)}
	switch cfg.Aggregation {
	case AggTokenSum:
		w.pg, w.reg = 1/b, w.diag
	case AggTokenMean:
		w.pg, w.reg = 1/math.Max(n.PGTokens, 1), 1/math.Max(n.Tokens, 1)
	case AggSeqMeanTokenSumNorm:
		w.pg = 1 / (b * float64(cfg.LossNormLen))
		w.reg = w.pg
	default: // sample_mean
		w.pg, w.reg = 1/(math.Max(sumPG, 1)*b), w.diag
	}
	return w
}
