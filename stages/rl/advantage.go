package rl

import (
	"errors"
	"fmt"
	"math"
)

// stdEps is added to the group std before dividing (grpo, gspo).
const stdEps = 1e-6

// whitenEps is added to the variance before the inverse square root of
// Whiten (reinforce++).
const whitenEps = 1e-8

// Advantages returns the per-sample advantage r̂_i of every sample; the
// token advantage is A_{i,t} = r̂_i for every response token of sample i.
//
// groups[i] is the prompt-group id of sample i; samples with equal ids form
// one group, in any order. Ids must be >= 0. method is "grpo" (also ""),
// "gspo" or "reinforce++":
//
//   - grpo and gspo: r̂_i = (r_i − mean_g) / (std_g + 1e-6) with the
//     unbiased (n − 1) std of the group; with normalizeStd false,
//     r̂_i = r_i − mean_g. A group of one sample has std 0 by definition
//     (torch would give NaN), so its advantage is 0.
//   - reinforce++: a_i = r_i − mean_g; with normalizeStd true the a_i are
//     then whitened over the whole batch, each sample weighted once:
//     r̂_i = Whiten(a, nil)_i. slime whitens over response tokens instead;
//     to reproduce that call Advantages with normalizeStd false and pass
//     the result to Whiten with each sample's masked token count.
//
// Rewards must be finite; lengths must match.
func Advantages(rewards []float64, groups []int, method string, normalizeStd bool) ([]float64, error) {
	if len(rewards) != len(groups) {
		return nil, fmt.Errorf("advantages: %d rewards but %d group ids", len(rewards), len(groups))
	}
	switch method {
	case "", AdvantageGRPO, AdvantageGSPO, AdvantageReinforcePlus:
	default:
		return nil, fmt.Errorf("advantages: unknown method %q", method)
	}
	type stat struct {
		n        int
		sum, ssq float64
	}
	stats := make(map[int]*stat)
	for i, r := range rewards {
		if !finite(r) {
			return nil, fmt.Errorf("advantages: reward %d is %v", i, r)
		}
		g := groups[i]
		if g < 0 {
			return nil, fmt.Errorf("advantages: group id %d of sample %d is negative", g, i)
		}
		s := stats[g]
		if s == nil {
			s = &stat{}
			stats[g] = s
		}
		s.n++
		s.sum += r
	}
	for i, r := range rewards {
		s := stats[groups[i]]
		d := r - s.sum/float64(s.n)
		s.ssq += d * d
	}
	out := make([]float64, len(rewards))
	for i, r := range rewards {
		s := stats[groups[i]]
		a := r - s.sum/float64(s.n)
		if normalizeStd && method != AdvantageReinforcePlus {
			std := 0.0
			if s.n > 1 {
				std = math.Sqrt(s.ssq / float64(s.n-1))
			}
			a /= std + stdEps
		}
		out[i] = a
	}
	if method == AdvantageReinforcePlus && normalizeStd && len(out) > 0 {
		return Whiten(out, nil)
	}
	return out, nil
}

// Whiten returns (v_i − μ) / sqrt(σ² + 1e-8) with weighted statistics:
// W = Σ w_i, μ = Σ w_i v_i / W, σ² = Σ w_i (v_i − μ)² / W, multiplied by
// W / (W − 1) when W >= 2 (Bessel). This is slime's
// distributed_masked_whiten when w_i is the masked token count of sample i;
// weights nil means every w_i = 1. Weights must be finite and >= 0 with a
// positive sum; values must be finite.
func Whiten(values, weights []float64) ([]float64, error) {
	if weights != nil && len(weights) != len(values) {
		return nil, fmt.Errorf("whiten: %d values but %d weights", len(values), len(weights))
	}
	w := func(i int) float64 {
		if weights == nil {
			return 1
		}
		return weights[i]
	}
	var sw, sv float64
	for i, v := range values {
		if !finite(v) {
			return nil, fmt.Errorf("whiten: value %d is %v", i, v)
		}
		if wi := w(i); !finite(wi) || wi < 0 {
			return nil, fmt.Errorf("whiten: weight %d is %v", i, wi)
		}
		sw += w(i)
		sv += w(i) * v
	}
	if sw <= 0 {
		return nil, errors.New("whiten: total weight is zero")
	}
	mean := sv / sw
	var ss float64
	for i, v := range values {
		d := v - mean
		ss += w(i) * d * d
	}
	variance := ss / sw
	if sw >= 2 {
		variance *= sw / (sw - 1)
	}
	inv := 1 / math.Sqrt(variance+whitenEps)
	out := make([]float64, len(values))
	for i, v := range values {
		out[i] = (v - mean) * inv
	}
	return out, nil
}
