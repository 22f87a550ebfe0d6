package rl

import (
	"math"
	"strings"
	"testing"
)

func TestDefaultLossConfigValid(t *testing.T) {
	c := DefaultLossConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("default config invalid: %v", err)
	}
	if c.Advantage != AdvantageGRPO || !c.NormalizeStd || c.EpsClip != 0.2 || c.ClipHigh() != 0.2 || c.Aggregation != AggSampleMean ||
		c.PolicyLoss != PolicyLossPPO || c.TIS != TISOff || c.LossNormLen != 0 || c.EffectiveTISCap() != 2 {
		t.Fatalf("unexpected defaults: %+v", c)
	}
	c.TIS, c.TISCap = TISMask, 1.5
	if got := c.EffectiveTISCap(); got != 1.5 {
		t.Fatalf("EffectiveTISCap = %v, want 1.5", got)
	}
}

func TestLossConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*LossConfig)
		want   string // substring of the error; "" means valid
	}{
		{"empty names take defaults", func(c *LossConfig) { c.Advantage, c.Aggregation = "", "" }, ""},
		{"gspo token_sum dual kl", func(c *LossConfig) {
			c.Advantage, c.Aggregation, c.DualClipC, c.KL, c.KLCoef, c.KLUnbiased = "gspo", "token_sum", 3, "low_var_kl", 0.01, true
		}, ""},
		{"eps_clip_high override", func(c *LossConfig) { c.EpsClipHigh = 0.28 }, ""},
		{"unknown advantage", func(c *LossConfig) { c.Advantage = "ppo" }, "advantage"},
		{"zero eps_clip", func(c *LossConfig) { c.EpsClip = 0 }, "eps_clip"},
		{"eps_clip one", func(c *LossConfig) { c.EpsClip = 1 }, "eps_clip"},
		{"nan eps_clip", func(c *LossConfig) { c.EpsClip = math.NaN() }, "eps_clip"},
		{"negative eps_clip_high", func(c *LossConfig) { c.EpsClipHigh = -0.1 }, "eps_clip_high"},
		{"dual clip 1", func(c *LossConfig) { c.DualClipC = 1 }, "dual_clip_c"},
		{"dual clip negative", func(c *LossConfig) { c.DualClipC = -3 }, "dual_clip_c"},
		{"unknown kl", func(c *LossConfig) { c.KL = "k4" }, "kl:"},
		{"kl_coef without kl", func(c *LossConfig) { c.KLCoef = 0.1 }, "kl_coef"},
		{"kl_unbiased without kl", func(c *LossConfig) { c.KLUnbiased = true }, "kl_unbiased"},
		{"negative kl_coef", func(c *LossConfig) { c.KL, c.KLCoef = "k3", -1 }, "kl_coef"},
		{"inf entropy_coef", func(c *LossConfig) { c.EntropyCoef = math.Inf(1) }, "entropy_coef"},
		{"unknown aggregation", func(c *LossConfig) { c.Aggregation = "seq_mean" }, "aggregation"},
		{"token_mean", func(c *LossConfig) { c.Aggregation = AggTokenMean }, ""},
		{"seq_mean_token_sum_norm", func(c *LossConfig) { c.Aggregation, c.LossNormLen = AggSeqMeanTokenSumNorm, 4096 }, ""},
		{"seq_mean_token_sum_norm without loss_norm_len", func(c *LossConfig) { c.Aggregation = AggSeqMeanTokenSumNorm }, "loss_norm_len"},
		{"negative loss_norm_len", func(c *LossConfig) { c.Aggregation, c.LossNormLen = AggSeqMeanTokenSumNorm, -1 }, "loss_norm_len"},
		{"loss_norm_len with token_mean", func(c *LossConfig) { c.Aggregation, c.LossNormLen = AggTokenMean, 8 }, "loss_norm_len"},
		{"loss_norm_len with sample_mean", func(c *LossConfig) { c.LossNormLen = 8 }, "loss_norm_len"},
		{"empty policy_loss", func(c *LossConfig) { c.PolicyLoss = "" }, ""},
		{"cispo", func(c *LossConfig) { c.PolicyLoss, c.EpsClipHigh = PolicyLossCISPO, 4 }, ""},
		{"unknown policy_loss", func(c *LossConfig) { c.PolicyLoss = "grpo" }, "policy_loss"},
		{"cispo with gspo", func(c *LossConfig) { c.PolicyLoss, c.Advantage = PolicyLossCISPO, AdvantageGSPO }, "policy_loss"},
		{"cispo with dual clip", func(c *LossConfig) { c.PolicyLoss, c.DualClipC = PolicyLossCISPO, 3 }, "dual_clip_c"},
		{"tis truncate", func(c *LossConfig) { c.TIS = TISTruncate }, ""},
		{"tis mask with cap", func(c *LossConfig) { c.TIS, c.TISCap = TISMask, 1.5 }, ""},
		{"tis cap 1", func(c *LossConfig) { c.TIS, c.TISCap = TISTruncate, 1 }, ""},
		{"unknown tis", func(c *LossConfig) { c.TIS = "clip" }, "tis:"},
		{"tis_cap without tis", func(c *LossConfig) { c.TISCap = 2 }, "tis_cap"},
		{"tis_cap below 1", func(c *LossConfig) { c.TIS, c.TISCap = TISTruncate, 0.5 }, "tis_cap"},
		{"negative tis_cap", func(c *LossConfig) { c.TIS, c.TISCap = TISMask, -2 }, "tis_cap"},
		{"inf tis_cap", func(c *LossConfig) { c.TIS, c.TISCap = TISMask, math.Inf(1) }, "tis_cap"},
		{"tis with rollout log-probs as old", func(c *LossConfig) { c.TIS, c.UseRolloutLogProbs = TISTruncate, true }, "use_rollout_log_probs"},
		{"rollout log-probs as old without tis", func(c *LossConfig) { c.UseRolloutLogProbs = true }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultLossConfig()
			tt.modify(&c)
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
	var nilCfg *LossConfig
	if nilCfg.Validate() == nil {
		t.Fatal("nil config validated")
	}
}
