package rl

import "testing"

// TestCISPOHand checks single-token samples against values computed by
// hand: pg = −min(ρ, 1 + ε_high)·A·l with the ratio detached, so the
// gradient is −min(ρ, 1 + ε_high)·A. The mini-batch has B = 4 samples and
// dp = 2: the loss and metrics are the per-sample values over 4 and the
// gradients the per-sample ones times 2/4.
func TestCISPOHand(t *testing.T) {
	tests := []struct {
		name     string
		high     float64
		old, rho float64
		adv      float64
		pg       float64
		dlogp    float64 // per sample, before dp/B
		clip     float64
	}{
		{"below the cap, A>0", 0, 0, 0.5, 1, -0.5 * ln(0.5), -0.5, 0},
		{"above the cap, A>0: weight capped, gradient kept", 0, 0, 1.5, 1, -1.2 * ln(1.5), -1.2, 1},
		// ppo would clip this token (ρ < 1 − ε, A < 0) and drop its gradient.
		{"below 1-eps, A<0: no lower clip", 0, 0, 0.5, -1, 0.5 * ln(0.5), 0.5, 0},
		{"above the cap, A<0", 0, 0, 1.5, -1, 1.2 * ln(1.5), 1.2, 1},
		{"just above the cap", 0, 0, 1.205, 1, -1.2 * ln(1.205), -1.2, 1},
		{"just below the cap", 0, 0, 1.195, 1, -1.195 * ln(1.195), -1.195, 0},
		{"eps_clip_high widens the cap", 0.28, 0, 1.25, 2, -1.25 * 2 * ln(1.25), -2.5, 0},
		{"eps_clip_high caps", 0.28, 0, 1.5, 2, -1.28 * 2 * ln(1.5), -2.56, 1},
		// The loss multiplies l itself, not log ρ.
		{"nonzero old log-prob", 0, -1, 1.1, 1, -1.1 * (-1 + ln(1.1)), -1.1, 0},
		{"zero advantage", 0, 0, 3, 0, 0, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultLossConfig()
			cfg.PolicyLoss = PolicyLossCISPO
			cfg.EpsClipHigh = tt.high
			l := tt.old + ln(tt.rho)
			b := &Batch{
				LogP:       f32s(l),
				OldLogP:    f32s(tt.old),
				Lengths:    []int{1},
				Advantages: []float64{tt.adv},
			}
			var out Output
			if err := ComputeLoss(cfg, b, Norm{DP: 2, Samples: 4}, &out); err != nil {
				t.Fatal(err)
			}
			assertClose(t, "loss", []float64{out.Loss}, []float64{tt.pg / 4}, 1e-6)
			assertClose(t, "dlogp", toF64(out.DLogP), []float64{tt.dlogp / 2}, 1e-6)
			m := out.Metrics
			assertClose(t, "metrics",
				[]float64{m.PGLoss, m.PGClipFrac, m.DualClipFrac, m.PPOKL, m.Ratio},
				[]float64{tt.pg / 4, tt.clip / 4, 0, -ln(tt.rho) / 4, tt.rho / 4}, 1e-6)
		})
	}
}

// TestCISPOGradientDetached checks that the cispo gradient is not the
// derivative of its loss value: d/dl of −ρ·A·l with ρ = exp(l − l_old)
// would be −ρ·A·(1 + l).
func TestCISPOGradientDetached(t *testing.T) {
	cfg := DefaultLossConfig()
	cfg.PolicyLoss = PolicyLossCISPO
	b := &Batch{LogP: f32s(-2), OldLogP: f32s(-2), Lengths: []int{1}, Advantages: []float64{1}}
	var out Output
	if err := ComputeLoss(cfg, b, Norm{DP: 1, Samples: 1}, &out); err != nil {
		t.Fatal(err)
	}
	// ρ = 1: value −A·l = 2, gradient −A = −1 (the full derivative is +1).
	assertClose(t, "loss and gradient", []float64{out.Loss, float64(out.DLogP[0])}, []float64{2, -1}, 1e-6)
}
