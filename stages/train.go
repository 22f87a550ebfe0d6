package stages

import (
	"github.com/rlpipe/rlpipe/spec"
)

// Train runs the policy-gradient update: the parameters of its `with:` block
// select the RL math of ../docs/rl.md.
type Train struct {
	Model              string  `yaml:"model"`
	ChunkTokens        int     `yaml:"chunk_tokens"`
	Advantage          string  `yaml:"advantage"` // grpo | reinforce++ | gspo
	NormalizeStd       bool    `yaml:"normalize_std"`
	EpsClip            float64 `yaml:"eps_clip"`
	EpsClipHigh        float64 `yaml:"eps_clip_high"` // 0: same as eps_clip
	DualClipC          float64 `yaml:"dual_clip_c"`   // 0: off
	KL                 string  `yaml:"kl"`            // "" | k1 | k2 | k3 | low_var_kl
	KLCoef             float64 `yaml:"kl_coef"`
	KLUnbiased         bool    `yaml:"kl_unbiased"`
	EntropyCoef        float64 `yaml:"entropy_coef"`
	EntropyTempered    bool    `yaml:"entropy_tempered"` // entropy of softmax(z/T) instead of softmax(z) (slime: off)
	Aggregation        string  `yaml:"aggregation"`      // sample_mean | token_sum
	UseRolloutLogProbs bool    `yaml:"use_rollout_log_probs"`
	Ref                string  `yaml:"ref"` // the ref_logprob stage whose log-probs the KL term uses
	Old                string  `yaml:"old"` // the actor_logprob stage whose log-probs are l_old
}

// NewTrain returns the train stage with its defaults (slime's).
func NewTrain() *Train {
	return &Train{Model: "actor", ChunkTokens: DefaultChunkTokens, Advantage: "grpo", NormalizeStd: true,
		EpsClip: 0.2, Aggregation: "sample_mean"}
}

// Validate checks the loss parameters and that the stages whose log-probs the
// loss reads exist.
func (s *Train) Validate(vc *ValidateContext) spec.Errors {
	m, errs := vc.sharded("model", s.Model)
	if m != nil && m.Spec.Role != "actor" {
		errs = append(errs, vc.Errorf("model", "train updates model %q whose role is %q; only the actor is trained", s.Model, m.Spec.Role))
	}
	errs = append(errs, vc.needsPack()...)
	if s.ChunkTokens < 1 {
		errs = append(errs, vc.Errorf("chunk_tokens", "chunk_tokens must be at least 1, got %d", s.ChunkTokens))
	}
	oneOf := func(key, v string, allowed ...string) {
		for _, a := range allowed {
			if v == a {
				return
			}
		}
		errs = append(errs, vc.Errorf(key, "%s must be one of %q, got %q", key, allowed, v))
	}
	oneOf("advantage", s.Advantage, "grpo", "reinforce++", "gspo")
	oneOf("kl", s.KL, "", "k1", "k2", "k3", "low_var_kl")
	oneOf("aggregation", s.Aggregation, "sample_mean", "token_sum")
	if s.EpsClip <= 0 || s.EpsClip >= 1 {
		errs = append(errs, vc.Errorf("eps_clip", "eps_clip must be in (0, 1), got %g", s.EpsClip))
	}
	if s.EpsClipHigh < 0 {
		errs = append(errs, vc.Errorf("eps_clip_high", "eps_clip_high must be >= 0, got %g", s.EpsClipHigh))
	}
	if s.DualClipC != 0 && s.DualClipC <= 1 {
		errs = append(errs, vc.Errorf("dual_clip_c", "dual_clip_c must be > 1 (or 0 to disable), got %g", s.DualClipC))
	}
	if s.KLCoef < 0 || s.EntropyCoef < 0 {
		errs = append(errs, vc.Errorf("kl_coef", "kl_coef and entropy_coef must be >= 0"))
	}
	if s.KL != "" && s.KLCoef > 0 {
		refs := vc.Job.stagesOfKind("ref_logprob", nil)
		switch {
		case s.Ref != "":
			if !hasStage(refs, s.Ref) {
				errs = append(errs, vc.Errorf("ref", "ref: no ref_logprob stage %q", s.Ref))
			}
		case len(refs) == 0:
			errs = append(errs, vc.Errorf("kl", "kl %q needs reference log-probs, but stages.step has no ref_logprob stage", s.KL))
		case len(refs) > 1:
			errs = append(errs, vc.Errorf("kl", "several ref_logprob stages; say which with ref:"))
		}
	}
	if s.Old != "" && !hasStage(vc.Job.stagesOfKind("actor_logprob", nil), s.Old) {
		errs = append(errs, vc.Errorf("old", "old: no actor_logprob stage %q", s.Old))
	}
	return errs
}

func hasStage(list []*spec.Stage, id string) bool {
	for _, st := range list {
		if st.ID == id {
			return true
		}
	}
	return false
}
