package rl

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
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

// TestTokenGradsSplit checks Fill over ranges long enough to be split
// over goroutines (GOMAXPROCS set to 4 for the test): ComputeLoss's
// gradients bit for bit, and, with two bad log-probs in different parts,
// the error of the first.
func TestTokenGradsSplit(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	rng := rand.New(rand.NewPCG(9, 10))
	tested := 0
	for ci, cfg := range referenceConfigs() {
		if !cfg.Separable(false) {
			continue
		}
		// Random batches of up to 28 tokens, concatenated.
		b := &Batch{}
		for len(b.LogP) < 6*fillSpan {
			r := randomBatch(rng, cfg)
			b.Lengths = append(b.Lengths, r.Lengths...)
			b.Advantages = append(b.Advantages, r.Advantages...)
			b.LogP = append(b.LogP, r.LogP...)
			b.OldLogP = append(b.OldLogP, r.OldLogP...)
			b.RolloutLogP = append(b.RolloutLogP, r.RolloutLogP...)
			b.RefLogP = append(b.RefLogP, r.RefLogP...)
			b.Entropy = append(b.Entropy, r.Entropy...)
			b.Mask = append(b.Mask, r.Mask...)
		}
		n := randomNorm(&cfg, b)
		var want Output
		if err := ComputeLoss(cfg, b, n, &want); err != nil {
			t.Fatalf("config %d: %v", ci, err)
		}
		g, err := NewTokenGrads(cfg, b, n)
		if err != nil {
			t.Fatalf("config %d: %v", ci, err)
		}
		N := len(b.LogP)
		dl, de := make([]float32, N), make([]float32, N)
		// Two ranges: one of several parts and the rest, of two or more.
		for _, r := range [][2]int{{0, 4*fillSpan + 17}, {4*fillSpan + 17, N}} {
			if err := g.Fill(r[0], r[1], dl, de); err != nil {
				t.Fatalf("config %d: %v", ci, err)
			}
		}
		for i := range dl {
			if math.Float32bits(dl[i]) != math.Float32bits(want.DLogP[i]) || math.Float32bits(de[i]) != math.Float32bits(want.DEntropy[i]) {
				t.Fatalf("config %d, token %d: TokenGrads %v, %v; ComputeLoss %v, %v", ci, i, dl[i], de[i], want.DLogP[i], want.DEntropy[i])
			}
		}
		tested++
		if ci > 0 {
			continue
		}
		// The first bad token's error, whichever part finishes first.
		first, second := -1, -1
		for i := range b.Mask {
			if b.Mask[i] != 0 && i > fillSpan/2 && first < 0 {
				first = i
			}
			if b.Mask[i] != 0 && i > 5*fillSpan {
				second = i
				break
			}
		}
		b.LogP[first], b.LogP[second] = float32(math.NaN()), float32(math.Inf(1))
		err = g.Fill(0, N, dl, de)
		if wantErr := fmt.Sprintf("log-prob %d is NaN", first); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("Fill with bad tokens %d and %d: %v, want an error with %q", first, second, err, wantErr)
		}
	}
	if tested < 5 {
		t.Fatalf("only %d configurations compared", tested)
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

// BenchmarkTokenGradsFill times Fill on one head chunk of the benchmark
// workload (8 samples of 1984 response tokens, GRPO with low_var_kl, a
// chunk of 2048 tokens) in one goroutine and split over GOMAXPROCS:
//
//	go test -run '^$' -bench TokenGradsFill ./stages/rl
func BenchmarkTokenGradsFill(bb *testing.B) {
	cfg := DefaultLossConfig()
	cfg.KL, cfg.KLCoef = KLLowVarKL, 0.01
	rng := rand.New(rand.NewPCG(1, 2))
	const samples, length, chunk = 8, 1984, 2048
	b := &Batch{}
	for range samples {
		b.Lengths = append(b.Lengths, length)
		b.Advantages = append(b.Advantages, rng.Float64()-0.5)
		for range length {
			b.LogP = append(b.LogP, -rng.Float32())
			b.OldLogP = append(b.OldLogP, -rng.Float32())
			b.RefLogP = append(b.RefLogP, -rng.Float32())
			b.Entropy = append(b.Entropy, rng.Float32())
			b.Mask = append(b.Mask, 1)
		}
	}
	g, err := NewTokenGrads(cfg, b, Norm{DP: 1, Samples: samples})
	if err != nil {
		bb.Fatal(err)
	}
	dl, de := make([]float32, len(b.LogP)), make([]float32, len(b.LogP))
	for _, procs := range []int{1, runtime.GOMAXPROCS(0)} {
		bb.Run(fmt.Sprintf("procs=%d", procs), func(sb *testing.B) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			for range sb.N {
				if err := g.Fill(0, chunk, dl, de); err != nil {
					sb.Fatal(err)
				}
			}
		})
	}
}
