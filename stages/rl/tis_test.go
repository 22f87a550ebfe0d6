package rl

import (
	"math"
	"slices"
	"strings"
	"testing"
)

// TestTISHand checks truncated importance sampling on one sample of four
// tokens with l = l_old = 0 (ρ = 1, A = 1, pg_t = −1, or −ρ for gspo),
// importance weights exp(x) = 0.5, 1, 3, 4 (x = l_old − l_rollout), a k1
// KL with x_kl = 1 (c_kl = 0.1) and entropies 2 (c_ent = 0.01). The KL and
// entropy terms keep the loss mask m; the policy term uses w or m'.
func TestTISHand(t *testing.T) {
	e := []float64{0.5, 1, 3, 4}
	var abs, k3 float64
	for _, v := range e {
		abs += math.Abs(ln(v)) / 4
		k3 += (1/v - 1 + ln(v)) / 4
	}
	rho := math.Exp(0.1)
	tests := []struct {
		name     string
		tis      string
		cap      float64
		adv      string
		agg      string
		logp     []float64 // nil: all 0
		norm     Norm
		pg       float64
		kl, ent  float64
		dlogp    []float64
		dentropy float64
		want     map[string]float64 // further metrics
	}{
		// w = 0.5, 1, 2, 2: pg Σ w·(−1)/4; dL/dl = (−w + 0.1)/4.
		{"truncate", TISTruncate, 0, "", AggSampleMean, nil, Norm{DP: 1, Samples: 1}, -5.5 / 4, 1, 2,
			[]float64{-0.1, -0.225, -0.475, -0.475}, -0.0025,
			map[string]float64{"tis_weight": 1.375, "tis_clipfrac": 0.5, "mismatch_abs": abs, "mismatch_k3": k3}},
		// dp 4 multiplies the gradients only; cap 2.5: w = 0.5, 1, 2.5, 2.5.
		{"truncate dp 4 cap 2.5", TISTruncate, 2.5, "", AggSampleMean, nil, Norm{DP: 4, Samples: 1}, -6.5 / 4, 1, 2,
			[]float64{-0.4, -0.9, -2.4, -2.4}, -0.01,
			map[string]float64{"tis_weight": 1.625, "tis_clipfrac": 0.5}},
		// m' = 1, 1, 0, 0 and D' = 2: pg −2/2; KL and entropy over D = 4.
		{"mask", TISMask, 0, "", AggSampleMean, nil, Norm{DP: 1, Samples: 1}, -1, 1, 2,
			[]float64{-0.475, -0.475, 0.025, 0.025}, -0.0025,
			map[string]float64{"tis_weight": 0.5, "tis_clipfrac": 0.5, "mismatch_abs": abs, "mismatch_k3": k3}},
		// B = 2: pg Σ m'·pg/B = −1; kl 4/(4·2); entropy 8/(4·2).
		{"mask token_sum", TISMask, 0, "", AggTokenSum, nil, Norm{DP: 1, Samples: 2}, -1, 0.5, 1,
			[]float64{-0.4875, -0.4875, 0.0125, 0.0125}, -0.00125,
			map[string]float64{"tis_weight": 0.25, "tis_clipfrac": 0.25, "mismatch_abs": abs / 2, "mismatch_k3": k3 / 2}},
		// N' = 5 normalises pg (−2/5), N = 10 the KL (4/10) and entropy (8/10).
		{"mask token_mean", TISMask, 0, "", AggTokenMean, nil, Norm{DP: 1, Samples: 2, Tokens: 10, PGTokens: 5}, -0.4, 0.4, 0.8,
			[]float64{-0.19, -0.19, 0.01, 0.01}, -0.001,
			map[string]float64{"tis_weight": 0.25, "tis_clipfrac": 0.25}},
		// B·L = 16: pg −5.5/16, kl 4/16, entropy 8/16.
		{"truncate seq_mean_token_sum_norm", TISTruncate, 0, "", AggSeqMeanTokenSumNorm, nil, Norm{DP: 1, Samples: 2}, -5.5 / 16, 0.25, 0.5,
			[]float64{-0.4 / 16, -0.9 / 16, -1.9 / 16, -1.9 / 16}, -0.01 / 16,
			map[string]float64{"tis_weight": 0.6875, "tis_clipfrac": 0.25}},
		// Off: mismatch metrics only, plain ppo.
		{"off with rollout log-probs", TISOff, 0, "", AggSampleMean, nil, Norm{DP: 1, Samples: 1}, -1, 1, 2,
			[]float64{-0.225, -0.225, -0.225, -0.225}, -0.0025,
			map[string]float64{"mismatch_abs": abs, "mismatch_k3": k3}},
		// gspo's ratio over m' only: δ = −0.1, ρ = e^0.1, inside the
		// clip range (over all tokens it would be e^0.3, clipped). The
		// gradient −ρ·m'/D' reaches the kept tokens only; the KL
		// (x_kl = 1 everywhere) keeps m.
		{"mask gspo", TISMask, 0, AdvantageGSPO, AggSampleMean, []float64{0.1, 0.1, 0.5, 0.5}, Norm{DP: 1, Samples: 1}, -rho, 1, 2,
			[]float64{-rho/2 + 0.025, -rho/2 + 0.025, 0.025, 0.025}, -0.0025,
			map[string]float64{"ppo_kl": -0.1, "ratio": rho, "pg_clipfrac": 0, "tis_weight": 0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultLossConfig()
			cfg.TIS, cfg.TISCap = tt.tis, tt.cap
			if tt.adv != "" {
				cfg.Advantage = tt.adv
			}
			setAggregation(&cfg, tt.agg)
			cfg.KL, cfg.KLCoef, cfg.EntropyCoef = KLK1, 0.1, 0.01
			logp := tt.logp
			if logp == nil {
				logp = make([]float64, 4)
			}
			ref := make([]float64, 4)
			for i, l := range logp {
				ref[i] = l - 1
			}
			b := &Batch{
				LogP:        f32s(logp...),
				OldLogP:     f32s(0, 0, 0, 0),
				RefLogP:     f32s(ref...),
				Entropy:     f32s(2, 2, 2, 2),
				RolloutLogP: f32s(-ln(e[0]), -ln(e[1]), -ln(e[2]), -ln(e[3])),
				Lengths:     []int{4},
				Advantages:  []float64{1},
			}
			var out Output
			if err := ComputeLoss(cfg, b, tt.norm, &out); err != nil {
				t.Fatal(err)
			}
			loss := tt.pg + 0.1*tt.kl - 0.01*tt.ent
			m := out.Metrics
			assertClose(t, "loss", []float64{out.Loss, m.PGLoss, m.KLLoss, m.EntropyLoss}, []float64{loss, tt.pg, tt.kl, tt.ent}, 1e-6)
			assertClose(t, "dlogp", toF64(out.DLogP), tt.dlogp, 1e-6)
			d := tt.dentropy
			assertClose(t, "dentropy", toF64(out.DEntropy), []float64{d, d, d, d}, 1e-6)
			vals := m.Values()
			for k, v := range tt.want {
				assertClose(t, k, []float64{vals[k]}, []float64{v}, 1e-6)
			}
			_, hasTIS := vals["tis_weight"]
			_, hasMismatch := vals["mismatch_abs"]
			if hasTIS != (tt.tis != TISOff) || !hasMismatch {
				t.Fatalf("logged names %v", vals)
			}
		})
	}
}

func TestPGMask(t *testing.T) {
	nan := float32(math.NaN())
	// exp(old − rollout) = 1, e^1, e^0.5, e^2 (> 2 at tokens 1 and 3).
	old := f32s(0, 0, 0, 0)
	ro := f32s(0, -1, -0.5, -2)
	tests := []struct {
		name     string
		tis      string
		cap      float64
		mask     []float32
		rollout  []float32
		want     []float32
		tok, pgT float64
	}{
		{"off, nil mask", TISOff, 0, nil, nil, []float32{1, 1, 1, 1}, 4, 4},
		{"off, mask copied", TISOff, 0, []float32{1, 0, 0.5, 1}, nil, []float32{1, 0, 0.5, 1}, 2.5, 2.5},
		{"truncate keeps the mask", TISTruncate, 0, []float32{1, 0, 1, 1}, ro, []float32{1, 0, 1, 1}, 3, 3},
		{"mask, nil mask", TISMask, 0, nil, ro, []float32{1, 0, 1, 0}, 4, 2},
		{"mask, cap 3", TISMask, 3, nil, ro, []float32{1, 1, 1, 0}, 4, 3},
		// A masked token is not read, even when its rollout log-prob is NaN.
		{"mask skips masked tokens", TISMask, 0, []float32{0.5, 1, 0, 1}, f32s(0, -1, float64(nan), 0), []float32{0.5, 0, 0, 1}, 2.5, 1.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultLossConfig()
			c.TIS, c.TISCap = tt.tis, tt.cap
			got, err := c.PGMask(tt.mask, old, tt.rollout)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("PGMask = %v, want %v", got, tt.want)
			}
			if tt.mask != nil && &got[0] == &tt.mask[0] {
				t.Fatal("PGMask returned the mask itself")
			}
			tok, pgT, err := c.TokenCounts(tt.mask, old, tt.rollout)
			if err != nil {
				t.Fatal(err)
			}
			assertClose(t, "counts", []float64{tok, pgT}, []float64{tt.tok, tt.pgT}, 1e-12)
		})
	}

	errs := []struct {
		name          string
		tis           string
		mask, rollout []float32
		want          string
	}{
		{"short mask", TISOff, []float32{1}, nil, "loss_mask"},
		{"negative mask", TISOff, []float32{1, -1, 1, 1}, nil, "loss mask 1"},
		{"tis without rollout", TISMask, nil, nil, "needs rollout"},
		{"short rollout", TISTruncate, nil, ro[:3], "rollout_log_probs"},
		{"nan rollout", TISMask, nil, f32s(0, float64(nan), 0, 0), "log-prob 1"},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultLossConfig()
			c.TIS = tt.tis
			_, err := c.PGMask(tt.mask, old, tt.rollout)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one mentioning %q", err, tt.want)
			}
			if _, _, err := c.TokenCounts(tt.mask, old, tt.rollout); err == nil {
				t.Fatal("TokenCounts accepted what PGMask rejects")
			}
		})
	}
	var nilCfg *LossConfig
	if _, err := nilCfg.PGMask(nil, old, nil); err == nil {
		t.Fatal("nil config accepted")
	}
}
