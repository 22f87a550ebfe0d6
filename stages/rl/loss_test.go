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
// against values computed by hand.
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
			for _, agg := range []string{AggSampleMean, AggTokenSum} {
				cfg.Aggregation = agg
				b := &Batch{
					LogP:       f32s(ln(tt.rho)),
					OldLogP:    f32s(0),
					Lengths:    []int{1},
					Advantages: []float64{tt.adv},
				}
				var out Output
				if err := ComputeLoss(cfg, b, 1, &out); err != nil {
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
			if err := ComputeLoss(cfg, b, 1, &out); err != nil {
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
			if err := ComputeLoss(cfg, b, 1, &out); err != nil {
				t.Fatal(err)
			}
			assertClose(t, "kl", []float64{out.Metrics.KLLoss, out.Loss}, []float64{tt.val, 0.1 * tt.val}, 1e-6)
			assertClose(t, "dlogp", toF64(out.DLogP), []float64{0.1 * tt.grad}, 1e-6)
		})
	}
}

// TestAggregation compares sample_mean and token_sum on two samples of 1
// and 3 tokens (ρ = 1, A = 1, pg_t = −1) with a k1 KL and an entropy
// bonus, which keep the per-sample mean in both modes, and scale 0.5.
func TestAggregation(t *testing.T) {
	tests := []struct {
		agg   string
		loss  float64
		pg    float64
		dlogp []float64
	}{
		// pg: −1 − 1 = −2; kl: 1 + 1 = 2 (x = 1); entropy: 2 + 2 = 4.
		// dL/dl: pg −w, kl 0.1·w with w = 1 or 1/3.
		{AggSampleMean, -2 + 0.1*2 - 0.01*4, -2, []float64{-0.9, -0.3, -0.3, -0.3}},
		// pg: Σ m·pg = −4; dL/dl: pg −1 everywhere, kl 0.1·w.
		{AggTokenSum, -4 + 0.1*2 - 0.01*4, -4, []float64{-0.9, -1 + 0.1/3, -1 + 0.1/3, -1 + 0.1/3}},
	}
	for _, tt := range tests {
		t.Run(tt.agg, func(t *testing.T) {
			cfg := DefaultLossConfig()
			cfg.Aggregation = tt.agg
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
			var out Output
			if err := ComputeLoss(cfg, b, 0.5, &out); err != nil {
				t.Fatal(err)
			}
			assertClose(t, "loss", []float64{out.Loss, out.Metrics.Loss, out.Metrics.PGLoss, out.Metrics.KLLoss, out.Metrics.EntropyLoss},
				[]float64{tt.loss, tt.loss, tt.pg, 2, 4}, 1e-6)
			want := make([]float64, len(tt.dlogp))
			for i, g := range tt.dlogp {
				want[i] = 0.5 * g
			}
			assertClose(t, "dlogp", toF64(out.DLogP), want, 1e-6)
			assertClose(t, "dentropy", toF64(out.DEntropy),
				[]float64{-0.5 * 0.01, -0.5 * 0.01 / 3, -0.5 * 0.01 / 3, -0.5 * 0.01 / 3}, 1e-6)
		})
	}
}

// TestMasks checks partial masks and an all-zero-mask sample.
func TestMasks(t *testing.T) {
	cfg := DefaultLossConfig()
	cfg.KL, cfg.KLCoef = KLK2, 1
	cfg.EntropyCoef = 0.5
	nan := math.NaN()
	b := &Batch{
		// Sample 0: tokens 0..2, middle masked. Sample 1: all masked.
		LogP:       f32s(ln(1.1), nan, ln(0.9), nan, 7),
		OldLogP:    f32s(0, nan, 0, 0, nan),
		RefLogP:    f32s(ln(1.1), nan, ln(0.9), 0, 0),
		Entropy:    f32s(1, nan, 3, nan, 5),
		Mask:       []float32{1, 0, 1, 0, 0},
		Lengths:    []int{3, 2},
		Advantages: []float64{1, 5},
	}
	var out Output
	if err := ComputeLoss(cfg, b, 1, &out); err != nil {
		t.Fatal(err)
	}
	// pg: (−1.1 − 0.9)/2 = −1; kl 0 (x = 0); entropy (1 + 3)/2 = 2.
	assertClose(t, "loss", []float64{out.Loss, out.Metrics.Tokens, float64(out.Metrics.Samples)}, []float64{-1 - 0.5*2, 2, 2}, 1e-6)
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
	if err := ComputeLoss(cfg2, b2, 1, &out); err != nil {
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
	if err := ComputeLoss(DefaultLossConfig(), b, 1, &out); err != nil {
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
			Entropy: f32s(1, 1, 1), Mask: []float32{1, 1, 1},
			Lengths: []int{1, 2}, Advantages: []float64{1, -1},
		}
	}
	klCfg := DefaultLossConfig()
	klCfg.KL, klCfg.KLCoef, klCfg.EntropyCoef = KLK3, 0.1, 0.01
	tests := []struct {
		name   string
		cfg    LossConfig
		modify func(*Batch)
		scale  float64
		want   string
	}{
		{"invalid config", LossConfig{EpsClip: 2}, func(*Batch) {}, 1, "eps_clip"},
		{"short old", klCfg, func(b *Batch) { b.OldLogP = b.OldLogP[:2] }, 1, "old_log_probs"},
		{"missing ref", klCfg, func(b *Batch) { b.RefLogP = nil }, 1, "ref log-probs"},
		{"short ref", klCfg, func(b *Batch) { b.RefLogP = b.RefLogP[:1] }, 1, "ref_log_probs"},
		{"missing entropy", klCfg, func(b *Batch) { b.Entropy = nil }, 1, "entropies"},
		{"long entropy", klCfg, func(b *Batch) { b.Entropy = f32s(1, 1, 1, 1) }, 1, "entropy"},
		{"short mask", klCfg, func(b *Batch) { b.Mask = b.Mask[:2] }, 1, "loss_mask"},
		{"advantage count", klCfg, func(b *Batch) { b.Advantages = b.Advantages[:1] }, 1, "advantages"},
		{"length sum", klCfg, func(b *Batch) { b.Lengths = []int{1, 1} }, 1, "sum"},
		{"negative length", klCfg, func(b *Batch) { b.Lengths = []int{4, -1} }, 1, "negative"},
		{"nan logp", klCfg, func(b *Batch) { b.LogP[1] = float32(math.NaN()) }, 1, "log-prob 1"},
		{"inf old", klCfg, func(b *Batch) { b.OldLogP[2] = float32(math.Inf(-1)) }, 1, "old log-prob 2"},
		{"nan ref", klCfg, func(b *Batch) { b.RefLogP[0] = float32(math.NaN()) }, 1, "ref log-prob 0"},
		{"nan entropy", klCfg, func(b *Batch) { b.Entropy[0] = float32(math.NaN()) }, 1, "entropy 0"},
		{"negative mask", klCfg, func(b *Batch) { b.Mask[0] = -1 }, 1, "loss mask"},
		{"nan advantage", klCfg, func(b *Batch) { b.Advantages[1] = math.NaN() }, 1, "advantage"},
		{"nan scale", klCfg, func(*Batch) {}, math.NaN(), "scale"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := good()
			tt.modify(b)
			var out Output
			err := ComputeLoss(tt.cfg, b, tt.scale, &out)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
	if err := ComputeLoss(DefaultLossConfig(), nil, 1, &Output{}); err == nil {
		t.Fatal("nil batch accepted")
	}
	if err := ComputeLoss(DefaultLossConfig(), good(), 1, nil); err == nil {
		t.Fatal("nil output accepted")
	}
}

func TestMetricsAddNormalize(t *testing.T) {
	a := Metrics{Samples: 2, Tokens: 10, Loss: 1, PGLoss: 2, PGClipFrac: 0.5, DualClipFrac: 0.25, PPOKL: 0.1, Ratio: 2, KLLoss: 0.2, EntropyLoss: 3}
	var sum Metrics
	sum.Add(a)
	sum.Add(a)
	if sum.Samples != 4 || sum.Tokens != 20 {
		t.Fatalf("counts = %d, %v", sum.Samples, sum.Tokens)
	}
	got, err := sum.Normalize(4)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"loss": 0.5, "pg_loss": 1, "pg_clipfrac": 0.25, "pg_dualclipfrac": 0.125, "ppo_kl": 0.05, "ratio": 1, "kl_loss": 0.1, "entropy_loss": 1.5}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for k, v := range want {
		if math.Abs(got[k]-v) > 1e-12 {
			t.Fatalf("%s = %v, want %v", k, got[k], v)
		}
	}
	if _, err := sum.Normalize(0); err == nil {
		t.Fatal("gbs 0 accepted")
	}
}

// TestGradientFiniteDifference checks DLogP and DEntropy against central
// differences of Loss for random inputs kept away from the kinks.
func TestGradientFiniteDifference(t *testing.T) {
	var cfgs []LossConfig
	for _, adv := range []string{AdvantageGRPO, AdvantageGSPO} {
		for _, agg := range []string{AggSampleMean, AggTokenSum} {
			for _, kl := range []string{KLNone, KLK1, KLK2, KLK3, KLLowVarKL} {
				for _, unbiased := range []bool{false, true} {
					if kl == KLNone && unbiased {
						continue
					}
					c := DefaultLossConfig()
					c.Advantage, c.Aggregation, c.KL, c.KLUnbiased = adv, agg, kl, unbiased
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
	rng := rand.New(rand.NewPCG(1, 2))
	const h = 1e-3
	for ci, cfg := range cfgs {
		b := randomBatch(rng, cfg)
		scale := 0.25
		var out Output
		if err := ComputeLoss(cfg, b, scale, &out); err != nil {
			t.Fatal(err)
		}
		lossAt := func() float64 {
			var o Output
			if err := ComputeLoss(cfg, b, scale, &o); err != nil {
				t.Fatal(err)
			}
			return scale * o.Loss
		}
		check := func(name string, vals []float32, grads []float32) {
			for i := range vals {
				v := vals[i]
				vals[i] = float32(float64(v) + h)
				up, hiV := lossAt(), float64(vals[i])
				vals[i] = float32(float64(v) - h)
				down, loV := lossAt(), float64(vals[i])
				vals[i] = v
				fd := (up - down) / (hiV - loV)
				g := float64(grads[i])
				if math.Abs(fd-g) > 1e-4*math.Max(1, math.Abs(fd)) {
					t.Errorf("cfg %d (%s/%s/kl=%s unbiased=%v) %s[%d]: analytic %.8g, finite difference %.8g",
						ci, cfg.Advantage, cfg.Aggregation, cfg.KL, cfg.KLUnbiased, name, i, g, fd)
				}
			}
		}
		check("logp", b.LogP, out.DLogP)
		check("entropy", b.Entropy, out.DEntropy)
	}
}

// randomBatch builds 4 samples of 0..6 tokens whose ratios (token-level or
// sequence-level) stay at least 0.03 away from the clip boundaries and the
// dual-clip constant, with some masked tokens and KL values inside the
// low_var_kl clamp.
func randomBatch(rng *rand.Rand, cfg LossConfig) *Batch {
	lo, hi, c := 1-cfg.EpsClip, 1+cfg.ClipHigh(), cfg.DualClipC
	safe := func(rho float64) bool {
		return math.Abs(rho-lo) > 0.03 && math.Abs(rho-hi) > 0.03 && math.Abs(rho-c) > 0.03 && math.Abs(rho-1) > 1e-3
	}
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
				old := -rng.Float64() * 3
				d := level + 0.05*rng.NormFloat64()
				l := float32(old + d)
				m := float32(1)
				if rng.IntN(5) == 0 {
					m = 0
				}
				b.LogP = append(b.LogP, l)
				b.OldLogP = append(b.OldLogP, float32(old))
				b.RefLogP = append(b.RefLogP, float32(float64(l)-0.8*rng.NormFloat64()))
				b.Entropy = append(b.Entropy, float32(rng.Float64()*4))
				b.Mask = append(b.Mask, m)
				dd := float64(l) - float64(float32(old))
				if m != 0 {
					sumM++
					sumD += dd
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
