package rl

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// TestTokenGrads checks that TokenGrads, filled a random range at a time
// with the log-probs and entropies of each range written just before,
// gives ComputeLoss's gradients bit for bit, for every separable
// configuration of referenceConfigs, with the old log-probs given and, for
// configurations without tis, with them being the current ones.
func TestTokenGrads(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	tested := 0
	for ci, cfg := range referenceConfigs() {
		for _, oldIsCurrent := range []bool{false, true} {
			if !cfg.Separable(oldIsCurrent) {
				continue
			}
			for trial := 0; trial < 4; trial++ {
				full := randomBatch(rng, cfg)
				if oldIsCurrent {
					full.OldLogP = full.LogP
				}
				n := randomNorm(&cfg, full)
				var want Output
				if err := ComputeLoss(cfg, full, n, &want); err != nil {
					t.Fatalf("config %d: %v", ci, err)
				}
				// The batch TokenGrads sees: the log-probs and entropies
				// are written range by range.
				part := *full
				part.LogP = make([]float32, len(full.LogP))
				part.Entropy = make([]float32, len(full.Entropy))
				if oldIsCurrent {
					part.OldLogP = part.LogP
				}
				g, err := NewTokenGrads(cfg, &part, n)
				if err != nil {
					t.Fatalf("config %d: %v", ci, err)
				}
				dl, de := make([]float32, len(full.LogP)), make([]float32, len(full.LogP))
				for i := range dl {
					dl[i], de[i] = float32(math.NaN()), float32(math.NaN())
				}
				for lo := 0; lo < len(full.LogP); {
					hi := min(lo+1+rng.IntN(4), len(full.LogP))
					copy(part.LogP[lo:hi], full.LogP[lo:hi])
					copy(part.Entropy[lo:hi], full.Entropy[lo:hi])
					if err := g.Fill(lo, hi, dl, de); err != nil {
						t.Fatalf("config %d: %v", ci, err)
					}
					lo = hi
				}
				for i := range dl {
					if math.Float32bits(dl[i]) != math.Float32bits(want.DLogP[i]) || math.Float32bits(de[i]) != math.Float32bits(want.DEntropy[i]) {
						t.Fatalf("config %d (%+v), token %d: TokenGrads %v, %v; ComputeLoss %v, %v", ci, cfg, i, dl[i], de[i], want.DLogP[i], want.DEntropy[i])
					}
				}
				tested++
			}
		}
	}
	if tested < 100 {
		t.Fatalf("only %d batches compared", tested)
	}
}

func TestTokenGradsErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	gspo := DefaultLossConfig()
	gspo.Advantage = AdvantageGSPO
	tis := DefaultLossConfig()
	tis.TIS = TISTruncate
	ppo := DefaultLossConfig()
	for _, tt := range []struct {
		name         string
		cfg          LossConfig
		oldIsCurrent bool
		edit         func(b *Batch)
		sentinel     error
	}{
		{"gspo", gspo, false, nil, ErrNotSeparable},
		{"tis with the current log-probs as old", tis, true, nil, ErrNotSeparable},
		{"short entropy", ppo, false, func(b *Batch) { b.Entropy = b.Entropy[:len(b.Entropy)-1] }, nil},
		{"lengths", ppo, false, func(b *Batch) { b.Lengths[0]++ }, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var b *Batch
			for b = randomBatch(rng, tt.cfg); len(b.LogP) == 0; b = randomBatch(rng, tt.cfg) {
			}
			if tt.oldIsCurrent {
				b.OldLogP = b.LogP
			}
			n := randomNorm(&tt.cfg, b)
			if tt.edit != nil {
				tt.edit(b)
			}
			_, err := NewTokenGrads(tt.cfg, b, n)
			if err == nil {
				t.Fatal("no error")
			}
			if tt.sentinel != nil && !errors.Is(err, tt.sentinel) {
				t.Fatalf("%v, want %v", err, tt.sentinel)
			}
		})
	}
	// A non-finite log-prob is reported by Fill.
	b := randomBatch(rng, ppo)
	for len(b.LogP) == 0 {
		b = randomBatch(rng, ppo)
	}
	for i := range b.Mask {
		b.Mask[i] = 1
	}
	g, err := NewTokenGrads(ppo, b, randomNorm(&ppo, b))
	if err != nil {
		t.Fatal(err)
	}
	b.LogP[0] = float32(math.Inf(-1))
	dl, de := make([]float32, len(b.LogP)), make([]float32, len(b.LogP))
	if err := g.Fill(0, 1, dl, de); err == nil {
		t.Fatal("Fill accepted a log-prob of -Inf")
	}
	if err := g.Fill(0, len(b.LogP)+1, dl, de); err == nil {
		t.Fatal("Fill accepted a range past the tokens")
	}
}
