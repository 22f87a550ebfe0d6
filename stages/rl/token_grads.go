package rl

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
)

// TokenGrads computes ComputeLoss's gradients a range of tokens at a time,
// as the tokens' log-probs become known, for a loss whose gradient at a
// token reads only that token's values and the sample sums of its mask:
// every variant but gspo, whose ratio is the sequence's, and truncated
// importance sampling against old log-probs that are the current ones
// (one update a step without an old_logprob stage), whose kept-token sums
// then follow the current log-probs. The gradients of each token equal
// ComputeLoss's bit for bit.
type TokenGrads struct {
	lc    *lossCtx
	wt    []weights // per sample
	adv   []float64 // per sample
	owner []int32   // the sample of each token
}

// ErrNotSeparable is returned by NewTokenGrads for a loss whose gradient at
// a token depends on other tokens' log-probs.
var ErrNotSeparable = errors.New("the loss gradient at a token depends on other tokens' log-probs")

// Separable reports whether cfg's gradient at a token reads only that
// token's values, given whether the old log-probs are the current ones.
func (cfg LossConfig) Separable(oldIsCurrent bool) bool {
	if cfg.Advantage == AdvantageGSPO {
		return false
	}
	return cfg.TIS == TISOff || !oldIsCurrent
}

// NewTokenGrads validates cfg, n and b as ComputeLoss does, except the
// values of b.LogP and b.Entropy, which Fill reads as they are filled in,
// and prepares the sample weights. b's slices must keep their length; b.LogP
// and b.Entropy may be written between calls to Fill, and b.OldLogP may be
// b.LogP itself.
func NewTokenGrads(cfg LossConfig, b *Batch, n Norm) (*TokenGrads, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if b == nil {
		return nil, errors.New("token grads: nil batch")
	}
	oldIsCurrent := len(b.LogP) > 0 && len(b.OldLogP) == len(b.LogP) && &b.OldLogP[0] == &b.LogP[0]
	if !cfg.Separable(oldIsCurrent) {
		return nil, fmt.Errorf("token grads: %w", ErrNotSeparable)
	}
	if err := n.check(len(b.Lengths)); err != nil {
		return nil, err
	}
	// checkBatch reads the log-probs and entropies of unmasked tokens; they
	// are not known yet, so it checks stand-ins, and Fill checks the values.
	probe := *b
	probe.LogP = make([]float32, len(b.LogP))
	if !oldIsCurrent {
		probe.OldLogP = b.OldLogP
	} else {
		probe.OldLogP = probe.LogP
	}
	if b.Entropy != nil {
		probe.Entropy = make([]float32, len(b.Entropy))
	}
	sums, err := checkBatch(&cfg, &probe)
	if err != nil {
		return nil, err
	}
	if err := checkTokenMean(&cfg, n, sums); err != nil {
		return nil, err
	}
	g := &TokenGrads{lc: newLossCtx(&cfg, b, n), adv: b.Advantages, owner: make([]int32, len(b.LogP))}
	start := 0
	for i, length := range b.Lengths {
		g.wt = append(g.wt, sampleWeights(&cfg, n, sums[i].m, sums[i].pg))
		for t := start; t < start+length; t++ {
			g.owner[t] = int32(i)
		}
		start += length
	}
	return g, nil
}

// fillSpan is the fewest tokens Fill gives a goroutine of its own: a
// token takes about 100 ns (mostly math.Exp), so a part takes tens of
// microseconds, more than its goroutine's start and join
// (BenchmarkTokenGradsFill times a chunk both ways).
const fillSpan = 256

// Fill writes the gradients of tokens [lo,hi) into dlogp and, when the
// batch has entropies, dentropy (both indexed like b.LogP), from the
// batch's values of those tokens, which it checks as ComputeLoss does.
// Masked tokens get 0. A range of more than fillSpan tokens is split over
// up to GOMAXPROCS goroutines (the host's part of a train step's head runs
// while the GPU waits for it); each token's values are the same either
// way, and an error is that of the first bad token, as in one pass, though
// tokens after it may then have been written.
func (g *TokenGrads) Fill(lo, hi int, dlogp, dentropy []float32) error {
	lc := g.lc
	if lo < 0 || hi > len(lc.b.LogP) || lo > hi {
		return fmt.Errorf("token grads: range [%d,%d) of %d tokens", lo, hi, len(lc.b.LogP))
	}
	if len(dlogp) != len(lc.b.LogP) || (lc.useEnt && len(dentropy) != len(lc.b.LogP)) {
		return fmt.Errorf("token grads: gradients of %d and %d entries for %d tokens", len(dlogp), len(dentropy), len(lc.b.LogP))
	}
	parts := min(runtime.GOMAXPROCS(0), (hi-lo)/fillSpan)
	if parts <= 1 {
		return g.fill(lo, hi, dlogp, dentropy)
	}
	errs := make([]error, parts)
	var wg sync.WaitGroup
	for i := range parts {
		a, b := lo+(hi-lo)*i/parts, lo+(hi-lo)*(i+1)/parts
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = g.fill(a, b, dlogp, dentropy)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// fill is Fill's loop over tokens [lo,hi).
func (g *TokenGrads) fill(lo, hi int, dlogp, dentropy []float32) error {
	lc := g.lc
	for t := lo; t < hi; t++ {
		dlogp[t] = 0
		if lc.useEnt {
			dentropy[t] = 0
		}
		if lc.mask(t) == 0 {
			continue
		}
		if err := checkToken(lc.b, t, lc.useKL, lc.useEnt); err != nil {
			return err
		}
		i := g.owner[t]
		tt := lc.token(t, g.adv[i], g.wt[i], 0)
		dlogp[t] = tt.dlogp
		if lc.useEnt {
			dentropy[t] = tt.dent
		}
	}
	return nil
}
