package rl

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func f32s(v ...float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

func ln(x float64) float64 { return math.Log(x) }

func toF64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// TestPolicyLossHand checks single-token samples (OldLogP 0, so ρ = e^l)
// against values computed by hand. With one sample of one token in a
// mini-batch of one sample, every aggregation gives the same loss.
func TestPolicyLossHand(t *testing.T) {
	tests := []struct {
		name     string
		dual     float64
		high     float64
		rho, adv float64
		loss     float64 // per-sample pg
		dlogp    float64 // dL/dl = dpg/dρ · ρ
		clip     float64
		dualFrac float64
	}{
		{"above 1+eps, A>0: clipped, no gradient", 0, 0, 1.5, 1, -1.2, 0, 1, 0},
		{"below 1-eps, A>0: unclipped", 0, 0, 0.5, 1, -0.5, -0.5, 0, 0},
		{"above 1+eps, A<0: unclipped", 0, 0, 1.5, -1, 1.5, 1.5, 0, 0},
		{"below 1-eps, A<0: clipped", 0, 0, 0.5, -1, 0.8, 0, 1, 0},
		{"in range", 0, 0, 1.1, 2, -2.2, -2.2, 0, 0},
		{"eps_clip_high widens upper range", 0, 0.28, 1.25, 1, -1.25, -1.25, 0, 0},
		{"eps_clip_high clips", 0, 0.28, 1.5, 1, -1.28, 0, 1, 0},
		{"dual clip with A<0", 3, 0, 4, -1, 3, 0, 0, 1},
		{"dual clip not reached", 3, 0, 2.5, -1, 2.5, 2.5, 0, 0},
		{"dual clip ignores A>0", 3, 0, 4, 1, -1.2, 0, 1, 0},
		{"zero advantage", 3, 0, 1.5, 0, 0, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultLossConfig()
			cfg.DualClipC = tt.dual
			cfg.EpsClipHigh = tt.high
			for _, agg := range []string{AggSampleMean, AggTokenSum, AggTokenMean, AggSeqMeanTokenSumNorm} {
				cfg.Aggregation, cfg.LossNormLen = agg, 0
				if agg == AggSeqMeanTokenSumNorm {
					cfg.LossNormLen = 1
				}
				b := &Batch{
					LogP:       f32s(ln(tt.rho)),
					OldLogP:    f32s(0),
					Lengths:    []int{1},
					Advantages: []float64{tt.adv},
				}
				var out Output
				if err := ComputeLoss(cfg, b, Norm{DP: 1, Samples: 1, Tokens: 1, PGTokens: 1}, &out); err != nil {
					t.Fatal(err)
				}
				assertClose(t, agg+" loss", []float64{out.Loss}, []float64{tt.loss}, 1e-6)
				assertClose(t, agg+" dlogp", toF64(out.DLogP), []float64{tt.dlogp}, 1e-6)
				m := out.Metrics
				assertClose(t, agg+" metrics",
					[]float64{m.PGLoss, m.PGClipFrac, m.DualClipFrac, m.PPOKL, m.Ratio, float64(m.Samples), m.Tokens},
					[]float64{tt.loss, tt.clip, tt.dualFrac, -ln(tt.rho), tt.rho, 1, 1}, 1e-6)
			}
		})
	}
}

// TestPolicyTermKinks checks torch's autograd rules exactly at the clip
// boundaries and at max/min ties.
func TestPolicyTermKinks(t *testing.T) {
	tests := []struct {
		name          string
		rho, a, c     float64
		pg, dpg, clip float64
		dualIndicator float64
	}{
		// At ρ = hi the two branches tie and clamp passes the gradient:
		// (−a + −a)/2 = −a.
		{"upper boundary", 1.2, 1, 0, -1.2, -1, 0, 0},
		{"lower boundary", 0.8, -1, 0, 0.8, 1, 0, 0},
		{"just above upper", 1.2 + 1e-9, 1, 0, -1.2, 0, 1, 0},
		// Tie between −c·a and the clipped loss: half the gradient.
		{"dual tie", 3, -1, 3, 3, 0.5, 0, 0},
		{"a zero", 2, 0, 0, 0, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pg, dpg, clip, dual := policyTerm(tt.rho, tt.a, 0.8, 1.2, tt.c)
			assertClose(t, "policy term", []float64{pg, dpg, clip, dual},
				[]float64{tt.pg, tt.dpg, tt.clip, tt.dualIndicator}, 1e-12)
		})
	}
}

func TestGSPOHand(t *testing.T) {
	tests := []struct {
		name   string
		logp   []float64
		mask   []float32
		adv    float64
		loss   float64
		dlogp  []float64
		ppokl  float64
		clip   float64
		ratio  float64
		tokens float64
	}{
		// δ = −(0.1 − 0.1)/2 = 0, ρ = 1, pg = −1; each token gets
		// −A·ρ·m/Σm = −0.5.
		{"broadcast", []float64{0.1, -0.1}, nil, 1, -1, []float64{-0.5, -0.5}, 0, 0, 1, 2},
		// The masked middle token is ignored (even a NaN).
		{"mask", []float64{0.1, math.NaN(), 0.1}, []float32{1, 0, 1}, 2, -2 * math.Exp(0.1),
			[]float64{-math.Exp(0.1), 0, -math.Exp(0.1)}, -0.1, 0, math.Exp(0.1), 2},
		// ρ = 1.5 with A > 0 is clipped: no gradient to any token.
		{"clipped", []float64{ln(1.5), ln(1.5)}, nil, 1, -1.2, []float64{0, 0}, -ln(1.5), 1, 1.5, 2},
		// Tokens with different log-probs share one ratio exp(mean).
		{"shared ratio", []float64{0.2, -0.6}, nil, -1, math.Exp(-0.2), []float64{math.Exp(-0.2) / 2, math.Exp(-0.2) / 2}, 0.2, 0, math.Exp(-0.2), 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultLossConfig()
			cfg.Advantage = AdvantageGSPO
			b := &Batch{
				LogP:       f32s(tt.logp...),
				OldLogP:    make([]float32, len(tt.logp)),
				Mask:       tt.mask,
				Lengths:    []int{len(tt.logp)},
				Advantages: []float64{tt.adv},
			}
			var out Output
			if err := ComputeLoss(cfg, b, Norm{DP: 1, Samples: 1}, &out); err != nil {
				t.Fatal(err)
			}
			assertClose(t, "loss", []float64{out.Loss}, []float64{tt.loss}, 1e-6)
			assertClose(t, "dlogp", toF64(out.DLogP), tt.dlogp, 1e-6)
			m := out.Metrics
			assertClose(t, "metrics", []float64{m.PPOKL, m.PGClipFrac, m.Ratio, m.Tokens},
				[]float64{tt.ppokl, tt.clip, tt.ratio, tt.tokens}, 1e-6)
		})
	}
}

// TestKLHand uses one token with A = 0 (no policy gradient), l = l_old = 0
// unless stated, and kl_coef 0.1.
func TestKLHand(t *testing.T) {
	e5 := math.Exp(-0.5)
	w := math.Exp(0.2) // unbiased weight for l = 0, l_old = −0.2
	tests := []struct {
		name      string
		kl        string
		unbiased  bool
		old, ref  float64
		val, grad float64 // kl and dkl/dl
	}{
		{"k1", KLK1, false, 0, -0.5, 0.5, 1},
		{"k2", KLK2, false, 0, -0.5, 0.125, 0.5},
		{"k3", KLK3, false, 0, -0.5, e5 - 0.5, 1 - e5},
		{"low_var_kl", KLLowVarKL, false, 0, -0.5, e5 - 0.5, 1 - e5},
		{"k3 unclamped", KLK3, false, 0, 20, math.Exp(20) - 21, 1 - math.Exp(20)},
		{"low_var_kl clamped", KLLowVarKL, false, 0, 20, 10, 0},
		{"k1 negative", KLK1, false, 0, 0.5, -0.5, 1},
		{"k1 unbiased", KLK1, true, -0.2, -0.5, w * 0.5, w + w*0.5},
		{"k3 unbiased", KLK3, true, -0.2, -0.5, w * (e5 - 0.5), w*(1-e5) + w*(e5-0.5)},
		{"low_var_kl unbiased clamped", KLLowVarKL, true, -3, 3, 10, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultLossConfig()
			cfg.KL, cfg.KLCoef, cfg.KLUnbiased = tt.kl, 0.1, tt.unbiased
			b := &Batch{
				LogP:       f32s(0),
				OldLogP:    f32s(tt.old),
				RefLogP:    f32s(tt.ref),
				Lengths:    []int{1},
				Advantages: []float64{0},
			}
			var out Output
			if err := ComputeLoss(cfg, b, Norm{DP: 1, Samples: 1}, &out); err != nil {
				t.Fatal(err)
			}
			assertClose(t, "kl", []float64{out.Metrics.KLLoss, out.Loss}, []float64{tt.val, 0.1 * tt.val}, 1e-6)
			assertClose(t, "dlogp", toF64(out.DLogP), []float64{0.1 * tt.grad}, 1e-6)
		})
	}
}

// TestAggregation compares the four aggregations on two samples of 1 and 3
// tokens (ρ = 1, A = 1, pg_t = −1) with a k1 KL (x = 1) and an entropy
// bonus (H = 2) in a mini-batch of B = 2 samples, N = N' = 8 tokens and
// L = 5. With dp = 1 the sample_mean and token_sum gradients are those of
// the old API at scale dp/GBS = 0.5; the loss is the old sum divided by 2.
func TestAggregation(t *testing.T) {
	tests := []struct {
		agg      string
		loss     float64
		pg       float64
		kl, ent  float64
		dlogp    []float64
		dentropy []float64
	}{
		// pg (−1 − 1)/2 = −1; kl (1 + 1)/2 = 1; entropy (2 + 2)/2 = 2.
		// dL/dl: (−1 + 0.1)·w/2 with w = 1 or 1/3.
		{AggSampleMean, -1 + 0.1*1 - 0.01*2, -1, 1, 2,
			[]float64{-0.45, -0.15, -0.15, -0.15}, []float64{-0.005, -0.01 / 6, -0.01 / 6, -0.01 / 6}},
		// pg Σ m·pg/B = −4/2; kl and entropy keep the per-sample mean.
		{AggTokenSum, -2 + 0.1*1 - 0.01*2, -2, 1, 2,
			[]float64{-0.45, -0.5 + 0.1/6, -0.5 + 0.1/6, -0.5 + 0.1/6}, []float64{-0.005, -0.01 / 6, -0.01 / 6, -0.01 / 6}},
		// Every term Σ m·x/N with N = 8: pg −4/8, kl 4/8, entropy 8/8.
		{AggTokenMean, -0.5 + 0.1*0.5 - 0.01*1, -0.5, 0.5, 1,
			[]float64{-0.1125, -0.1125, -0.1125, -0.1125}, []float64{-0.00125, -0.00125, -0.00125, -0.00125}},
		// Every term Σ m·x/(B·L) with B·L = 10: pg −0.4, kl 0.4, entropy 0.8.
		{AggSeqMeanTokenSumNorm, -0.4 + 0.1*0.4 - 0.01*0.8, -0.4, 0.4, 0.8,
			[]float64{-0.09, -0.09, -0.09, -0.09}, []float64{-0.001, -0.001, -0.001, -0.001}},
	}
	for _, tt := range tests {
		t.Run(tt.agg, func(t *testing.T) {
			cfg := DefaultLossConfig()
			cfg.Aggregation = tt.agg
			if tt.agg == AggSeqMeanTokenSumNorm {
				cfg.LossNormLen = 5
			}
			cfg.KL, cfg.KLCoef = KLK1, 0.1
			cfg.EntropyCoef = 0.01
			b := &Batch{
				LogP:       f32s(0, 0, 0, 0),
				OldLogP:    f32s(0, 0, 0, 0),
				RefLogP:    f32s(-1, -1, -1, -1),
				Entropy:    f32s(2, 2, 2, 2),
				Lengths:    []int{1, 3},
				Advantages: []float64{1, 1},
			}
			// The gradients are those of dp × the loss; the loss does not
			// depend on dp.
			for _, dp := range []int{1, 3} {
				var out Output
				if err := ComputeLoss(cfg, b, Norm{DP: dp, Samples: 2, Tokens: 8, PGTokens: 8}, &out); err != nil {
					t.Fatal(err)
				}
				m := out.Metrics
				assertClose(t, "loss", []float64{out.Loss, m.Loss, m.PGLoss, m.KLLoss, m.EntropyLoss},
					[]float64{tt.loss, tt.loss, tt.pg, tt.kl, tt.ent}, 1e-6)
				// Diagnostics stay per-sample means: ρ = 1 over B = 2.
				assertClose(t, "diagnostics", []float64{m.Ratio, m.PPOKL, m.PGClipFrac, float64(m.Samples), m.Tokens},
					[]float64{1, 0, 0, 2, 4}, 1e-6)
				want, wantEnt := make([]float64, 4), make([]float64, 4)
				for i := range want {
					want[i] = float64(dp) * tt.dlogp[i]
					wantEnt[i] = float64(dp) * tt.dentropy[i]
				}
				assertClose(t, "dlogp", toF64(out.DLogP), want, 1e-6)
				assertClose(t, "dentropy", toF64(out.DEntropy), wantEnt, 1e-6)
			}
		})
	}
}

// TestMasks checks partial masks and an all-zero-mask sample. Norm{DP: 2,
// Samples: 2} has dp/GBS = 1, so the gradients are the per-micro-batch
// ones and the loss is the sum over the two samples divided by 2.
func TestMasks(t *testing.T) {
	cfg := DefaultLossConfig()
	cfg.KL, cfg.KLCoef = KLK2, 1
	cfg.EntropyCoef = 0.5
	nan := math.NaN()
	b := &Batch{
		// Sample 0: tokens 0..2, middle masked. Sample 1: all masked.
		LogP:        f32s(ln(1.1), nan, ln(0.9), nan, 7),
		OldLogP:     f32s(0, nan, 0, 0, nan),
		RefLogP:     f32s(ln(1.1), nan, ln(0.9), 0, 0),
		Entropy:     f32s(1, nan, 3, nan, 5),
		Mask:        []float32{1, 0, 1, 0, 0},
		RolloutLogP: f32s(0, nan, 0, nan, nan),
		Lengths:     []int{3, 2},
		Advantages:  []float64{1, 5},
	}
	var out Output
	if err := ComputeLoss(cfg, b, Norm{DP: 2, Samples: 2}, &out); err != nil {
		t.Fatal(err)
	}
	// pg: (−1.1 − 0.9)/2 = −1; kl 0 (x = 0); entropy (1 + 3)/2 = 2; the
	// sum −1 − 0.5·2 over 2 samples.
	assertClose(t, "loss", []float64{out.Loss, out.Metrics.Tokens, float64(out.Metrics.Samples)}, []float64{(-1 - 0.5*2) / 2, 2, 2}, 1e-6)
	assertClose(t, "dlogp", toF64(out.DLogP), []float64{-0.55, 0, -0.45, 0, 0}, 1e-6)
	assertClose(t, "dentropy", toF64(out.DEntropy), []float64{-0.25, 0, -0.25, 0, 0}, 1e-6)

	// Fractional masks weight tokens; the denominator is max(Σm, 1).
	b2 := &Batch{
		LogP:       f32s(0, 0),
		OldLogP:    f32s(0, 0),
		Mask:       []float32{0.25, 0.25},
		Lengths:    []int{2},
		Advantages: []float64{1},
	}
	cfg2 := DefaultLossConfig()
	if err := ComputeLoss(cfg2, b2, Norm{DP: 1, Samples: 1}, &out); err != nil {
		t.Fatal(err)
	}
	assertClose(t, "fractional", []float64{out.Loss, out.Metrics.Tokens}, []float64{-0.5, 0.5}, 1e-6)
	if len(out.DEntropy) != 0 {
		t.Fatalf("DEntropy has %d entries without entropies", len(out.DEntropy))
	}
}

// TestOutputReuse checks that stale gradients are cleared when buffers are
// reused.
func TestOutputReuse(t *testing.T) {
	out := Output{DLogP: []float32{9, 9, 9, 9}, DEntropy: []float32{9, 9, 9}}
	b := &Batch{
		LogP: f32s(0, 0), OldLogP: f32s(0, 0), Mask: []float32{0, 1},
		Lengths: []int{2}, Advantages: []float64{1},
	}
	if err := ComputeLoss(DefaultLossConfig(), b, Norm{DP: 1, Samples: 1}, &out); err != nil {
		t.Fatal(err)
	}
	assertClose(t, "dlogp", toF64(out.DLogP), []float64{0, -1}, 1e-12)
	if len(out.DEntropy) != 0 {
		t.Fatal("stale DEntropy kept")
	}
}

func TestComputeLossErrors(t *testing.T) {
	good := func() *Batch {
		return &Batch{
			LogP: f32s(0, 0, 0), OldLogP: f32s(0, 0, 0), RefLogP: f32s(0, 0, 0),
			Entropy: f32s(1, 1, 1), Mask: []float32{1, 1, 1}, RolloutLogP: f32s(0, 0, -1),
			Lengths: []int{1, 2}, Advantages: []float64{1, -1},
		}
	}
	klCfg := DefaultLossConfig()
	klCfg.KL, klCfg.KLCoef, klCfg.EntropyCoef = KLK3, 0.1, 0.01
	tisCfg := DefaultLossConfig()
	tisCfg.TIS = TISMask
	meanCfg := DefaultLossConfig()
	meanCfg.Aggregation = AggTokenMean
	meanTIS := meanCfg
	meanTIS.TIS = TISMask
	norm := Norm{DP: 1, Samples: 4, Tokens: 3, PGTokens: 3}
	tests := []struct {
		name   string
		cfg    LossConfig
		modify func(*Batch)
		norm   Norm
		want   string
	}{
		{"invalid config", LossConfig{EpsClip: 2}, func(*Batch) {}, norm, "eps_clip"},
		{"short old", klCfg, func(b *Batch) { b.OldLogP = b.OldLogP[:2] }, norm, "old_log_probs"},
		{"missing ref", klCfg, func(b *Batch) { b.RefLogP = nil }, norm, "ref log-probs"},
		{"short ref", klCfg, func(b *Batch) { b.RefLogP = b.RefLogP[:1] }, norm, "ref_log_probs"},
		{"missing entropy", klCfg, func(b *Batch) { b.Entropy = nil }, norm, "entropies"},
		{"long entropy", klCfg, func(b *Batch) { b.Entropy = f32s(1, 1, 1, 1) }, norm, "entropy"},
		{"short mask", klCfg, func(b *Batch) { b.Mask = b.Mask[:2] }, norm, "loss_mask"},
		{"advantage count", klCfg, func(b *Batch) { b.Advantages = b.Advantages[:1] }, norm, "advantages"},
		{"length sum", klCfg, func(b *Batch) { b.Lengths = []int{1, 1} }, norm, "sum"},
		{"negative length", klCfg, func(b *Batch) { b.Lengths = []int{4, -1} }, norm, "negative"},
		{"nan logp", klCfg, func(b *Batch) { b.LogP[1] = float32(math.NaN()) }, norm, "log-prob 1"},
		{"inf old", klCfg, func(b *Batch) { b.OldLogP[2] = float32(math.Inf(-1)) }, norm, "old log-prob 2"},
		{"nan ref", klCfg, func(b *Batch) { b.RefLogP[0] = float32(math.NaN()) }, norm, "ref log-prob 0"},
		{"nan entropy", klCfg, func(b *Batch) { b.Entropy[0] = float32(math.NaN()) }, norm, "entropy 0"},
		{"negative mask", klCfg, func(b *Batch) { b.Mask[0] = -1 }, norm, "loss mask"},
		{"nan advantage", klCfg, func(b *Batch) { b.Advantages[1] = math.NaN() }, norm, "advantage"},
		{"short rollout", klCfg, func(b *Batch) { b.RolloutLogP = b.RolloutLogP[:2] }, norm, "rollout_log_probs"},
		{"nan rollout", klCfg, func(b *Batch) { b.RolloutLogP[1] = float32(math.NaN()) }, norm, "rollout log-prob 1"},
		{"tis without rollout", tisCfg, func(b *Batch) { b.RolloutLogP = nil }, norm, "needs rollout log-probs"},
		{"zero dp", klCfg, func(*Batch) {}, Norm{Samples: 4}, "dp"},
		{"zero samples", klCfg, func(*Batch) {}, Norm{DP: 1}, "samples"},
		{"fewer samples than the micro-batch", klCfg, func(*Batch) {}, Norm{DP: 1, Samples: 1}, "samples"},
		{"nan tokens", klCfg, func(*Batch) {}, Norm{DP: 1, Samples: 2, Tokens: math.NaN()}, "tokens"},
		{"negative pg tokens", klCfg, func(*Batch) {}, Norm{DP: 1, Samples: 2, PGTokens: -1}, "pg tokens"},
		{"token_mean without tokens", meanCfg, func(*Batch) {}, Norm{DP: 1, Samples: 2}, "norm tokens 0"},
		{"token_mean short tokens", meanCfg, func(*Batch) {}, Norm{DP: 1, Samples: 2, Tokens: 2.5, PGTokens: 3}, "norm tokens 2.5"},
		// Under tis mask, token 2 (exp(1) > 2) leaves the policy term: N' ≥ 2.
		{"token_mean short pg tokens", meanTIS, func(*Batch) {}, Norm{DP: 1, Samples: 2, Tokens: 3, PGTokens: 1.5}, "pg tokens 1.5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := good()
			tt.modify(b)
			var out Output
			err := ComputeLoss(tt.cfg, b, tt.norm, &out)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
	// The limits themselves are accepted.
	for _, tt := range []struct {
		name string
		cfg  LossConfig
		norm Norm
	}{
		{"samples equal to the micro-batch", klCfg, Norm{DP: 1, Samples: 2}},
		{"token_mean exact tokens", meanCfg, Norm{DP: 1, Samples: 2, Tokens: 3, PGTokens: 3}},
		{"token_mean exact pg tokens", meanTIS, Norm{DP: 1, Samples: 2, Tokens: 3, PGTokens: 2}},
	} {
		if err := ComputeLoss(tt.cfg, good(), tt.norm, &Output{}); err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
	if err := ComputeLoss(DefaultLossConfig(), nil, norm, &Output{}); err == nil {
		t.Fatal("nil batch accepted")
	}
	if err := ComputeLoss(DefaultLossConfig(), good(), norm, nil); err == nil {
		t.Fatal("nil output accepted")
	}
}

// TestGradientFiniteDifference checks DLogP and DEntropy against central
// differences of DP·Loss for random inputs kept away from the kinks. Under
// cispo the ratio is detached, so the difference is taken with l_old and
// l_rollout moved together with l: that keeps the ratio and the TIS weight
// fixed and leaves exactly the gradient that cispo defines.
func TestGradientFiniteDifference(t *testing.T) {
	var cfgs []LossConfig
	for _, adv := range []string{AdvantageGRPO, AdvantageGSPO} {
		for _, agg := range aggregations {
			for _, kl := range []string{KLNone, KLK1, KLK2, KLK3, KLLowVarKL} {
				for _, unbiased := range []bool{false, true} {
					if kl == KLNone && unbiased {
						continue
					}
					c := DefaultLossConfig()
					c.Advantage, c.KL, c.KLUnbiased = adv, kl, unbiased
					setAggregation(&c, agg)
					if kl != KLNone {
						c.KLCoef = 0.3
					}
					c.EntropyCoef = 0.02
					c.DualClipC = 3
					c.EpsClipHigh = 0.28
					cfgs = append(cfgs, c)
				}
			}
		}
	}
	for _, pl := range []string{PolicyLossPPO, PolicyLossCISPO} {
		for _, tis := range []string{TISOff, TISTruncate, TISMask} {
			for _, adv := range []string{AdvantageGRPO, AdvantageGSPO} {
				if pl == PolicyLossCISPO && adv == AdvantageGSPO {
					continue
				}
				for k, agg := range aggregations {
					c := DefaultLossConfig()
					c.PolicyLoss, c.TIS, c.Advantage = pl, tis, adv
					setAggregation(&c, agg)
					c.KL, c.KLCoef, c.EntropyCoef, c.EpsClipHigh = KLK3, 0.3, 0.02, 0.28
					if pl == PolicyLossPPO {
						c.DualClipC = 3
					}
					if tis != TISOff && k%2 == 1 {
						c.TISCap = 1.5
					}
					cfgs = append(cfgs, c)
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const h = 1.0 / 1024 // exact on the 2^-12 grid of randomBatch
	for ci, cfg := range cfgs {
		b := randomBatch(rng, cfg)
		n := randomNorm(&cfg, b)
		var out Output
		if err := ComputeLoss(cfg, b, n, &out); err != nil {
			t.Fatal(err)
		}
		lossAt := func() float64 {
			var o Output
			if err := ComputeLoss(cfg, b, n, &o); err != nil {
				t.Fatal(err)
			}
			return float64(n.DP) * o.Loss
		}
		check := func(name string, grads []float32, vals ...[]float32) {
			for i := range grads {
				shift := func(d float64) {
					for _, v := range vals {
						v[i] = float32(float64(v[i]) + d)
					}
				}
				shift(h)
				up := lossAt()
				shift(-2 * h)
				down := lossAt()
				shift(h)
				fd := (up - down) / (2 * h)
				g := float64(grads[i])
				if math.Abs(fd-g) > 1e-4*math.Max(1, math.Abs(fd)) {
					t.Errorf("cfg %d (%s/%s/%s/tis=%q/kl=%s unbiased=%v) %s[%d]: analytic %.8g, finite difference %.8g",
						ci, cfg.PolicyLoss, cfg.Advantage, cfg.Aggregation, cfg.TIS, cfg.KL, cfg.KLUnbiased, name, i, g, fd)
				}
			}
		}
		if cfg.PolicyLoss == PolicyLossCISPO {
			check("logp", out.DLogP, b.LogP, b.OldLogP, b.RolloutLogP)
		} else {
			check("logp", out.DLogP, b.LogP)
		}
		check("entropy", out.DEntropy, b.Entropy)
	}
}

// aggregations lists every aggregation mode.
var aggregations = []string{AggSampleMean, AggTokenSum, AggTokenMean, AggSeqMeanTokenSumNorm}

// setAggregation sets c's aggregation, with loss_norm_len 8 where it is
// required.
func setAggregation(c *LossConfig, agg string) {
	c.Aggregation, c.LossNormLen = agg, 0
	if agg == AggSeqMeanTokenSumNorm {
		c.LossNormLen = 8
	}
}

// randomNorm returns the normalisation of a mini-batch of dp 2 that holds b
// and other micro-batches: 3 more samples, 7.5 more tokens and 5 more
// policy-term tokens.
func randomNorm(cfg *LossConfig, b *Batch) Norm {
	tok, pgTok, err := cfg.TokenCounts(b.Mask, b.OldLogP, b.RolloutLogP)
	if err != nil {
		panic(err)
	}
	return Norm{DP: 2, Samples: len(b.Lengths) + 3, Tokens: tok + 7.5, PGTokens: pgTok + 5}
}

// randomBatch builds 4 samples of 0..6 tokens whose ratios (token-level or
// sequence-level, the latter over the policy-term mask) stay at least 0.03
// away from the clip boundaries and the dual-clip constant, with some
// masked tokens, KL values inside the low_var_kl clamp, and rollout
// log-probs whose importance weights are spread on both sides of the TIS
// cap. Every value lies on a 2^-12 grid, so that float32 sums and
// differences with steps of 2^-10 are exact.
func randomBatch(rng *rand.Rand, cfg LossConfig) *Batch {
	lo, hi, c := 1-cfg.EpsClip, 1+cfg.ClipHigh(), cfg.DualClipC
	capC := cfg.EffectiveTISCap()
	safe := func(rho float64) bool {
		return math.Abs(rho-lo) > 0.03 && math.Abs(rho-hi) > 0.03 && math.Abs(rho-c) > 0.03 && math.Abs(rho-1) > 1e-3
	}
	q := func(v float64) float32 { return float32(math.Round(v*4096) / 4096) }
	b := &Batch{}
	for {
		*b = Batch{}
		ok := true
		for i := 0; i < 4; i++ {
			n := rng.IntN(7)
			b.Lengths = append(b.Lengths, n)
			b.Advantages = append(b.Advantages, rng.NormFloat64())
			// A sample-wide log-ratio level so that some samples sit
			// outside the clip range (and beyond c) as a whole.
			level := []float64{0, 0.5, -0.5, 1.4}[rng.IntN(4)]
			var sumM, sumD float64
			for t := 0; t < n; t++ {
				old := q(-rng.Float64() * 3)
				l := q(float64(old) + level + 0.05*rng.NormFloat64())
				ro := q(float64(old) - 0.6*rng.NormFloat64())
				m := float32(1)
				if rng.IntN(5) == 0 {
					m = 0
				}
				b.LogP = append(b.LogP, l)
				b.OldLogP = append(b.OldLogP, old)
				b.RolloutLogP = append(b.RolloutLogP, ro)
				b.RefLogP = append(b.RefLogP, q(float64(l)-0.8*rng.NormFloat64()))
				b.Entropy = append(b.Entropy, q(rng.Float64()*4))
				b.Mask = append(b.Mask, m)
				dd := float64(l) - float64(old)
				if m != 0 {
					if cfg.TIS != TISMask || math.Exp(float64(old)-float64(ro)) <= capC {
						sumM++
						sumD += dd
					}
					if cfg.Advantage != AdvantageGSPO && !safe(math.Exp(dd)) {
						ok = false
					}
				}
			}
			if cfg.Advantage == AdvantageGSPO && !safe(math.Exp(sumD/math.Max(sumM, 1))) {
				ok = false
			}
		}
		if ok {
			return b
		}
	}
}
