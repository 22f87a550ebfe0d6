package rl

import (
	"errors"
	"fmt"
	"math"
)

// tisToken applies truncated importance sampling to one token with
// x = l_old − l_rollout under cap c. It returns the factor w that
// multiplies the token's policy term (min(exp(x), c) under truncate, 1
// otherwise), whether the token stays in the policy term (false only under
// mask when exp(x) > c), and whether exp(x) > c. With mode off it returns
// (1, true, false). The factor depends on no trained value, so it carries
// no gradient (sg(w) in the formulas).
func tisToken(mode string, c, x float64) (w float64, keep, over bool) {
	if mode == TISOff {
		return 1, true, false
	}
	e := math.Exp(x)
	over = e > c
	if mode == TISTruncate {
		return math.Min(e, c), true, over
	}
	return 1, !over, over
}

// mismatch returns |x| and the k3 estimator exp(−x) − 1 + x for
// x = l_old − l_rollout.
func mismatch(x float64) (abs, k3 float64) {
	return math.Abs(x), math.Exp(-x) - 1 + x
}

// PGMask returns m', the mask of the policy-gradient term: mask itself
// (nil means all ones) with, when c.TIS is mask, 0 at every token whose
// importance weight exp(l_old − l_rollout) exceeds the cap. The result is
// a new slice of len(oldLogP) entries, so the caller can sum it over a
// mini-batch for Norm.PGTokens. Tokens with mask 0 are not read.
// rolloutLogP is required when c.TIS is set and ignored otherwise.
func (c *LossConfig) PGMask(mask, oldLogP, rolloutLogP []float32) ([]float32, error) {
	if c == nil {
		return nil, errors.New("pg mask: loss config is nil")
	}
	n := len(oldLogP)
	if mask != nil && len(mask) != n {
		return nil, fmt.Errorf("pg mask: loss_mask has %d entries but old_log_probs has %d", len(mask), n)
	}
	if c.TIS != TISOff {
		if rolloutLogP == nil {
			return nil, fmt.Errorf("pg mask: tis %q needs rollout log-probs", c.TIS)
		}
		if len(rolloutLogP) != n {
			return nil, fmt.Errorf("pg mask: rollout_log_probs has %d entries but old_log_probs has %d", len(rolloutLogP), n)
		}
	}
	capC := c.EffectiveTISCap()
	out := make([]float32, n)
	for t := range out {
		m := float32(1)
		if mask != nil {
			m = mask[t]
		}
		if !finite(float64(m)) || m < 0 {
			return nil, fmt.Errorf("pg mask: loss mask %d is %v", t, m)
		}
		if m == 0 || c.TIS == TISOff {
			out[t] = m
			continue
		}
		old, ro := float64(oldLogP[t]), float64(rolloutLogP[t])
		if !finite(old) || !finite(ro) {
			return nil, fmt.Errorf("pg mask: old or rollout log-prob %d is not finite (%v, %v)", t, old, ro)
		}
		if _, keep, _ := tisToken(c.TIS, capC, old-ro); keep {
			out[t] = m
		}
	}
	return out, nil
}

// TokenCounts returns Σ m and Σ m' (see PGMask) over the given tokens: a
// micro-batch's share of Norm.Tokens and Norm.PGTokens.
func (c *LossConfig) TokenCounts(mask, oldLogP, rolloutLogP []float32) (tokens, pgTokens float64, err error) {
	pm, err := c.PGMask(mask, oldLogP, rolloutLogP)
	if err != nil {
		return 0, 0, err
	}
	for t, v := range pm {
		if mask == nil {
			tokens++
		} else {
			tokens += float64(mask[t])
		}
		pgTokens += float64(v)
	}
	return tokens, pgTokens, nil
}
