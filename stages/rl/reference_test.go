package rl

import (
	"math"
	"math/rand/v2"
	"testing"
)

// refValues restates the mini-batch objective and the logged metrics of
// docs/rl.md token by token in float64, independently of ComputeLoss: it
// returns the contribution of micro-batch b to every logged value.
func refValues(cfg LossConfig, b *Batch, n Norm) map[string]float64 {
	bs := float64(n.Samples)
	lo, hi := 1-cfg.EpsClip, 1+cfg.EpsClip
	if cfg.EpsClipHigh != 0 {
		hi = 1 + cfg.EpsClipHigh
	}
	capC := cfg.TISCap
	if capC == 0 {
		capC = 2
	}
	// Every logged name starts at 0, so that it is expected even where
	// no token adds to it.
	v := map[string]float64{}
	for _, name := range []string{"loss", "pg_loss", "pg_clipfrac", "pg_dualclipfrac", "ppo_kl", "ratio", "kl_loss", "entropy_loss"} {
		v[name] = 0
	}
	if b.RolloutLogP != nil {
		v["mismatch_abs"], v["mismatch_k3"] = 0, 0
	}
	if cfg.TIS != TISOff {
		v["tis_weight"], v["tis_clipfrac"] = 0, 0
	}
	off := 0
	for i, r := range b.Lengths {
		a := b.Advantages[i]
		m := make([]float64, r)  // loss mask
		mp := make([]float64, r) // policy-term mask
		w := make([]float64, r)  // TIS factor of the policy term
		var sumM, sumMP float64
		for t := range r {
			m[t], w[t] = 1, 1
			if b.Mask != nil {
				m[t] = float64(b.Mask[off+t])
			}
			sumM += m[t]
		}
		d := math.Max(sumM, 1)
		for t := range r {
			k := off + t
			mp[t] = m[t]
			if b.RolloutLogP != nil && m[t] != 0 {
				diag := m[t] / (d * bs)
				x := float64(b.OldLogP[k]) - float64(b.RolloutLogP[k])
				iw := math.Exp(x)
				v["mismatch_abs"] += diag * math.Abs(x)
				v["mismatch_k3"] += diag * (math.Exp(-x) - 1 + x)
				switch cfg.TIS {
				case TISTruncate:
					w[t] = math.Min(iw, capC)
					v["tis_weight"] += diag * w[t]
				case TISMask:
					if iw > capC {
						mp[t] = 0
					} else {
						v["tis_weight"] += diag
					}
				}
				if cfg.TIS != TISOff && iw > capC {
					v["tis_clipfrac"] += diag
				}
			}
			sumMP += mp[t]
		}
		dp := math.Max(sumMP, 1)
		// Per-token log-ratio l − l_old: gspo shares the m'-weighted mean.
		logRatio := make([]float64, r)
		var seq float64
		for t := range r {
			logRatio[t] = float64(b.LogP[off+t]) - float64(b.OldLogP[off+t])
			seq += mp[t] * logRatio[t]
		}
		if cfg.Advantage == AdvantageGSPO {
			for t := range r {
				logRatio[t] = seq / dp
			}
		}
		for t := range r {
			if m[t] == 0 {
				continue
			}
			k := off + t
			rho := math.Exp(logRatio[t])
			var pg, clip, dual float64
			if cfg.PolicyLoss == PolicyLossCISPO {
				pg = -math.Min(rho, hi) * a * float64(b.LogP[k])
				if rho > hi {
					clip = 1
				}
			} else {
				unclipped := -rho * a
				clipped := -math.Max(lo, math.Min(hi, rho)) * a
				pg = math.Max(unclipped, clipped)
				if clipped > unclipped {
					clip = 1
				}
				if c := cfg.DualClipC; c != 0 && a < 0 && -c*a < pg {
					pg, dual = -c*a, 1
				}
			}
			var pgW, regW float64
			switch cfg.Aggregation {
			case AggTokenSum:
				pgW, regW = mp[t]/bs, m[t]/(d*bs)
			case AggTokenMean:
				pgW, regW = mp[t]/math.Max(n.PGTokens, 1), m[t]/math.Max(n.Tokens, 1)
			case AggSeqMeanTokenSumNorm:
				l := float64(cfg.LossNormLen)
				pgW, regW = mp[t]/(bs*l), m[t]/(bs*l)
			default:
				pgW, regW = mp[t]/(dp*bs), m[t]/(d*bs)
			}
			diag := m[t] / (d * bs)
			v["pg_loss"] += pgW * w[t] * pg
			v["pg_clipfrac"] += diag * clip
			v["pg_dualclipfrac"] += diag * dual
			v["ppo_kl"] += diag * -logRatio[t]
			v["ratio"] += diag * rho
			if cfg.KL != KLNone {
				l, ref := float64(b.LogP[k]), float64(b.RefLogP[k])
				x := l - ref
				kl := map[string]float64{KLK1: x, KLK2: x * x / 2, KLK3: math.Exp(-x) - 1 + x, KLLowVarKL: math.Exp(-x) - 1 + x}[cfg.KL]
				if cfg.KLUnbiased {
					kl *= math.Exp(l - float64(b.OldLogP[k]))
				}
				if cfg.KL == KLLowVarKL {
					kl = math.Max(-10, math.Min(10, kl))
				}
				v["kl_loss"] += regW * kl
			}
			if b.Entropy != nil {
				v["entropy_loss"] += regW * float64(b.Entropy[k])
			}
		}
		off += r
	}
	v["loss"] = v["pg_loss"] - cfg.EntropyCoef*v["entropy_loss"] + cfg.KLCoef*v["kl_loss"]
	return v
}

// referenceConfigs returns loss configurations over every policy loss,
// advantage, aggregation, TIS mode and a spread of KL and clip settings.
func referenceConfigs() []LossConfig {
	var cfgs []LossConfig
	for _, pl := range []string{PolicyLossPPO, PolicyLossCISPO} {
		for _, adv := range []string{AdvantageGRPO, AdvantageGSPO} {
			if pl == PolicyLossCISPO && adv == AdvantageGSPO {
				continue
			}
			for _, agg := range aggregations {
				for _, tis := range []string{TISOff, TISTruncate, TISMask} {
					for k, kl := range []string{KLNone, KLK2, KLLowVarKL} {
						c := DefaultLossConfig()
						c.PolicyLoss, c.Advantage, c.TIS = pl, adv, tis
						setAggregation(&c, agg)
						c.EntropyCoef, c.EpsClipHigh = 0.02, 0.28
						if kl != KLNone {
							c.KL, c.KLCoef, c.KLUnbiased = kl, 0.3, k == 2
						}
						if pl == PolicyLossPPO && k != 1 {
							c.DualClipC = 3
						}
						if tis != TISOff && k == 1 {
							c.TISCap = 1.5
						}
						cfgs = append(cfgs, c)
					}
				}
			}
		}
	}
	return cfgs
}

// TestReference compares the loss and every logged value of ComputeLoss
// with refValues on random batches, with and without rollout log-probs.
func TestReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for ci, cfg := range referenceConfigs() {
		for _, dropRollout := range []bool{false, true} {
			if dropRollout && cfg.TIS != TISOff {
				continue
			}
			b := randomBatch(rng, cfg)
			if dropRollout {
				b.RolloutLogP = nil
			}
			n := randomNorm(&cfg, b)
			var out Output
			if err := ComputeLoss(cfg, b, n, &out); err != nil {
				t.Fatal(err)
			}
			got := out.Metrics.Values()
			want := refValues(cfg, b, n)
			for name, w := range want {
				if g, ok := got[name]; !ok || math.Abs(g-w) > 1e-9*math.Max(1, math.Abs(w)) {
					t.Errorf("cfg %d (%s/%s/%s/tis=%q/kl=%s rollout=%v): %s = %.12g (logged %v), reference %.12g",
						ci, cfg.PolicyLoss, cfg.Advantage, cfg.Aggregation, cfg.TIS, cfg.KL, !dropRollout, name, g, ok, w)
				}
			}
			for _, name := range []string{"mismatch_abs", "mismatch_k3", "tis_weight", "tis_clipfrac"} {
				_, logged := got[name]
				_, expected := want[name]
				if logged != expected {
					t.Errorf("cfg %d: %s logged %v, want %v", ci, name, logged, expected)
				}
			}
			if math.Abs(out.Loss-want["loss"]) > 1e-9*math.Max(1, math.Abs(want["loss"])) {
				t.Errorf("cfg %d: Loss %.12g, reference %.12g", ci, out.Loss, want["loss"])
			}
		}
	}
}

// TestMicroBatchSplit checks that the mini-batch objective does not depend
// on how its samples are split into micro-batches: the losses and metrics
// of the parts add up to those of the whole, and every token gets the same
// gradient.
func TestMicroBatchSplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for ci, cfg := range referenceConfigs() {
		b := randomBatch(rng, cfg)
		n := randomNorm(&cfg, b)
		var whole Output
		if err := ComputeLoss(cfg, b, n, &whole); err != nil {
			t.Fatal(err)
		}
		var sum Metrics
		var dlogp, dent []float32
		tok := 0
		for _, part := range [][2]int{{0, 1}, {1, 3}, {3, 4}} {
			s0, s1 := part[0], part[1]
			t0 := tok
			for _, l := range b.Lengths[s0:s1] {
				tok += l
			}
			pb := &Batch{
				LogP: b.LogP[t0:tok], OldLogP: b.OldLogP[t0:tok], RefLogP: b.RefLogP[t0:tok],
				Entropy: b.Entropy[t0:tok], Mask: b.Mask[t0:tok], RolloutLogP: b.RolloutLogP[t0:tok],
				Lengths: b.Lengths[s0:s1], Advantages: b.Advantages[s0:s1],
			}
			var out Output
			if err := ComputeLoss(cfg, pb, n, &out); err != nil {
				t.Fatal(err)
			}
			sum.Add(out.Metrics)
			dlogp = append(dlogp, out.DLogP...)
			dent = append(dent, out.DEntropy...)
		}
		got, want := sum.Values(), whole.Metrics.Values()
		if len(got) != len(want) || sum.Samples != whole.Metrics.Samples || sum.Tokens != whole.Metrics.Tokens {
			t.Fatalf("cfg %d: split metrics %+v, whole %+v", ci, sum, whole.Metrics)
		}
		for name, w := range want {
			if math.Abs(got[name]-w) > 1e-12*math.Max(1, math.Abs(w)) {
				t.Errorf("cfg %d: %s split %.15g, whole %.15g", ci, name, got[name], w)
			}
		}
		for i := range dlogp {
			if dlogp[i] != whole.DLogP[i] || dent[i] != whole.DEntropy[i] {
				t.Fatalf("cfg %d: token %d gradients split (%v, %v), whole (%v, %v)", ci, i, dlogp[i], dent[i], whole.DLogP[i], whole.DEntropy[i])
			}
		}
	}
}
