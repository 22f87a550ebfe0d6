package rl

import (
	"errors"
	"fmt"
	"math"
)

// Advantage estimators accepted by LossConfig.Advantage and Advantages.
const (
	AdvantageGRPO          = "grpo"
	AdvantageReinforcePlus = "reinforce++"
	AdvantageGSPO          = "gspo"
)

// KL estimators accepted by LossConfig.KL.
const (
	KLNone     = ""
	KLK1       = "k1"
	KLK2       = "k2"
	KLK3       = "k3"
	KLLowVarKL = "low_var_kl"
)

// Aggregation modes accepted by LossConfig.Aggregation.
const (
	AggSampleMean          = "sample_mean"
	AggTokenSum            = "token_sum"
	AggTokenMean           = "token_mean"
	AggSeqMeanTokenSumNorm = "seq_mean_token_sum_norm"
)

// Policy losses accepted by LossConfig.PolicyLoss.
const (
	PolicyLossPPO   = "ppo"
	PolicyLossCISPO = "cispo"
)

// Truncated-importance-sampling modes accepted by LossConfig.TIS.
const (
	TISOff      = ""
	TISTruncate = "truncate"
	TISMask     = "mask"
)

// DefaultTISCap is the cap C used when LossConfig.TISCap is 0.
const DefaultTISCap = 2.0

// lowVarKLClamp is the symmetric clamp applied to the low_var_kl estimator.
const lowVarKLClamp = 10.0

// LossConfig selects the policy-loss variant of the train stage. The field
// comments name the snake_case key of the train stage's with: block.
type LossConfig struct {
	// Advantage is the estimator: "grpo" (default when empty),
	// "reinforce++" or "gspo" (key advantage). gspo also switches the
	// policy ratio to the sequence-level ratio.
	Advantage string
	// NormalizeStd divides grpo/gspo advantages by the group std and
	// turns on batch whitening for reinforce++ (key normalize_std).
	NormalizeStd bool
	// EpsClip is the lower clip range ε: ratios are clipped to
	// [1-ε, 1+ε_high] (key eps_clip, default 0.2). It must be in (0, 1).
	EpsClip float64
	// EpsClipHigh is the upper clip range ε_high; 0 means EpsClip
	// (key eps_clip_high).
	EpsClipHigh float64
	// DualClipC is the dual-clip constant c; 0 turns dual clip off,
	// otherwise it must be > 1 (key dual_clip_c).
	DualClipC float64
	// KL is the KL estimator to the reference: "" (none), "k1", "k2",
	// "k3" (unclamped) or "low_var_kl" (k3 clamped to [-10, 10]) (key kl).
	KL string
	// KLCoef multiplies the KL term (key kl_coef). It must be 0 when KL
	// is empty.
	KLCoef float64
	// KLUnbiased multiplies the KL estimator by exp(l_t - l_old,t)
	// (key kl_unbiased). The weight is not detached, as in slime.
	KLUnbiased bool
	// EntropyCoef multiplies the entropy bonus: the loss is reduced by
	// EntropyCoef times the aggregated entropy (key entropy_coef).
	EntropyCoef float64
	// Aggregation is how per-token terms are summed and normalised over
	// a mini-batch (key aggregation): "sample_mean" (default when empty),
	// "token_sum", "token_mean" or "seq_mean_token_sum_norm". See Norm
	// for the weights of each mode.
	Aggregation string
	// LossNormLen is the fixed length L of seq_mean_token_sum_norm
	// (key loss_norm_len), normally the generation's maximum response
	// length. It is required (> 0) with that aggregation and must be 0
	// with the others.
	LossNormLen int
	// PolicyLoss is the policy-gradient term: "ppo" (default when empty),
	// the clipped surrogate, or "cispo", the clipped-ratio-weighted
	// log-prob of MiniMax-M1 (key policy_loss).
	PolicyLoss string
	// UseRolloutLogProbs makes l_old the rollout engine's log-probs
	// instead of the actor recompute (key use_rollout_log_probs). The
	// caller honours it by filling Batch.OldLogP accordingly.
	UseRolloutLogProbs bool
	// TIS corrects the rollout/train mismatch by truncated importance
	// sampling with weights exp(l_old − l_rollout) (key tis): "" (off),
	// "truncate" (the policy term of each token is multiplied by the
	// weight capped at TISCap) or "mask" (tokens whose weight exceeds
	// TISCap leave the policy term). It needs Batch.RolloutLogP.
	TIS string
	// TISCap is the cap C of TIS (key tis_cap); 0 means DefaultTISCap.
	// It must be 0 when TIS is off.
	TISCap float64
}

// DefaultLossConfig returns the defaults: grpo advantages normalised by the
// group std, the ppo policy loss with eps_clip 0.2 on both sides, no dual
// clip, no KL, no entropy bonus, per-sample-mean aggregation,
// actor-recomputed old log-probs and no truncated importance sampling.
func DefaultLossConfig() LossConfig {
	return LossConfig{
		Advantage:    AdvantageGRPO,
		NormalizeStd: true,
		EpsClip:      0.2,
		Aggregation:  AggSampleMean,
		PolicyLoss:   PolicyLossPPO,
	}
}

// Validate reports the first invalid field of c, naming its spec key.
func (c *LossConfig) Validate() error {
	if c == nil {
		return errors.New("loss config is nil")
	}
	switch c.Advantage {
	case "", AdvantageGRPO, AdvantageReinforcePlus, AdvantageGSPO:
	default:
		return fmt.Errorf("advantage: unknown estimator %q (want grpo, reinforce++ or gspo)", c.Advantage)
	}
	if !finite(c.EpsClip) || c.EpsClip <= 0 || c.EpsClip >= 1 {
		return fmt.Errorf("eps_clip: %v is not in (0, 1)", c.EpsClip)
	}
	if !finite(c.EpsClipHigh) || c.EpsClipHigh < 0 {
		return fmt.Errorf("eps_clip_high: %v must be finite and >= 0 (0 means eps_clip)", c.EpsClipHigh)
	}
	if !finite(c.DualClipC) || (c.DualClipC != 0 && c.DualClipC <= 1) {
		return fmt.Errorf("dual_clip_c: %v must be 0 (off) or > 1", c.DualClipC)
	}
	switch c.KL {
	case KLNone:
		if c.KLCoef != 0 {
			return fmt.Errorf("kl_coef: %v is set but kl is empty", c.KLCoef)
		}
		if c.KLUnbiased {
			return errors.New("kl_unbiased: set but kl is empty")
		}
	case KLK1, KLK2, KLK3, KLLowVarKL:
		if !finite(c.KLCoef) || c.KLCoef < 0 {
			return fmt.Errorf("kl_coef: %v must be finite and >= 0", c.KLCoef)
		}
	default:
		return fmt.Errorf("kl: unknown estimator %q (want k1, k2, k3 or low_var_kl)", c.KL)
	}
	if !finite(c.EntropyCoef) {
		return fmt.Errorf("entropy_coef: %v is not finite", c.EntropyCoef)
	}
	switch c.Aggregation {
	case "", AggSampleMean, AggTokenSum, AggTokenMean:
		if c.LossNormLen != 0 {
			return fmt.Errorf("loss_norm_len: %d is set but aggregation is not seq_mean_token_sum_norm", c.LossNormLen)
		}
	case AggSeqMeanTokenSumNorm:
		if c.LossNormLen <= 0 {
			return fmt.Errorf("loss_norm_len: %d must be > 0 with aggregation seq_mean_token_sum_norm", c.LossNormLen)
		}
	default:
		return fmt.Errorf("aggregation: unknown mode %q (want sample_mean, token_sum, token_mean or seq_mean_token_sum_norm)", c.Aggregation)
	}
	switch c.PolicyLoss {
	case "", PolicyLossPPO:
	case PolicyLossCISPO:
		if c.Advantage == AdvantageGSPO {
			return errors.New("policy_loss: cispo does not combine with advantage gspo")
		}
		if c.DualClipC != 0 {
			return fmt.Errorf("dual_clip_c: %v is set but policy_loss cispo has no dual clip", c.DualClipC)
		}
	default:
		return fmt.Errorf("policy_loss: unknown loss %q (want ppo or cispo)", c.PolicyLoss)
	}
	switch c.TIS {
	case TISOff:
		if c.TISCap != 0 {
			return fmt.Errorf("tis_cap: %v is set but tis is off", c.TISCap)
		}
	case TISTruncate, TISMask:
		if !finite(c.TISCap) || (c.TISCap != 0 && c.TISCap < 1) {
			return fmt.Errorf("tis_cap: %v must be 0 (default %v) or finite and >= 1", c.TISCap, DefaultTISCap)
		}
		if c.UseRolloutLogProbs {
			return errors.New("tis: use_rollout_log_probs makes l_old the rollout log-probs, so every weight would be 1")
		}
	default:
		return fmt.Errorf("tis: unknown mode %q (want truncate or mask)", c.TIS)
	}
	return nil
}

// ClipHigh returns the effective upper clip range: EpsClipHigh, or EpsClip
// when EpsClipHigh is 0.
func (c *LossConfig) ClipHigh() float64 {
	if c.EpsClipHigh == 0 {
		return c.EpsClip
	}
	return c.EpsClipHigh
}

// EffectiveTISCap returns the cap C of truncated importance sampling:
// TISCap, or DefaultTISCap when TISCap is 0.
func (c *LossConfig) EffectiveTISCap() float64 {
	if c.TISCap == 0 {
		return DefaultTISCap
	}
	return c.TISCap
}

func finite(x float64) bool {
	return !math.IsNaN(x) && !math.IsInf(x, 0)
}
