package stages

import (
	"github.com/rlpipe/rlpipe/spec"
)

func init() {
	Register(Kind{Name: "load_hf", Phase: spec.Setup, Doc: "read an HF checkpoint (config.json + safetensors); each rank streams only its shard", New: func() Stage { return &LoadHF{} }})
	Register(Kind{Name: "apply_fsdp2", Phase: spec.Setup, Doc: "shard a model FSDP2-style: fp32 master shards, per-unit gather for compute, grads and AdamW state", New: func() Stage { return &ApplyFSDP2{ReshardAfterForward: true, Prefetch: 1} }})
	Register(Kind{Name: "pack", Phase: spec.Step, Doc: "balance the step's rollouts over dp ranks by tokens and pack them into varlen micro-batches", New: func() Stage { return &Pack{} }})
	Register(Kind{Name: "ref_logprob", Phase: spec.Step, Doc: "per-token log-probs of the reference model, in token chunks", New: func() Stage { return &LogProb{Model: "ref", ChunkTokens: DefaultChunkTokens} }})
	Register(Kind{Name: "actor_logprob", Phase: spec.Step, Doc: "per-token log-probs of the actor before the update (the PPO old policy)", New: func() Stage { return &LogProb{Model: "actor", ChunkTokens: DefaultChunkTokens} }})
	Register(Kind{Name: "train", Phase: spec.Step, Doc: "PPO/GRPO policy loss, KL, entropy; backward; grad clip; AdamW step", New: func() Stage { return NewTrain() }})
	Register(Kind{Name: "update_ref", Phase: spec.Step, Doc: "copy the actor's weights into the reference model", New: func() Stage { return &UpdateRef{From: "actor", To: "ref"} }})
}

// DefaultChunkTokens is the default number of tokens whose logits are
// materialised at once by the log-prob stages.
const DefaultChunkTokens = 1024

// LoadHF reads an HF checkpoint. Parameters: model (required).
type LoadHF struct {
	Model string `yaml:"model"`
}

// Validate checks that the model exists and is read from a directory.
func (s *LoadHF) Validate(vc *ValidateContext) spec.Errors {
	m, errs := vc.model("model", s.Model)
	if m != nil && m.Spec.CopyOf != "" {
		errs = append(errs, vc.Errorf("model", "model %q is a copy of %q and has no checkpoint to load; load %q instead", s.Model, m.Spec.CopyOf, m.Spec.CopyOf))
	}
	return errs
}

// ApplyFSDP2 shards a model over the dp ranks.
type ApplyFSDP2 struct {
	Model               string `yaml:"model"`
	ReshardAfterForward bool   `yaml:"reshard_after_forward"`
	Prefetch            int    `yaml:"prefetch"` // units gathered ahead of the one computing (0 or 1)
}

// Validate checks the model and that its weights are loaded by an earlier stage.
func (s *ApplyFSDP2) Validate(vc *ValidateContext) spec.Errors {
	m, errs := vc.model("model", s.Model)
	if s.Prefetch < 0 || s.Prefetch > 1 {
		errs = append(errs, vc.Errorf("prefetch", "prefetch must be 0 or 1, got %d", s.Prefetch))
	}
	if m == nil {
		return errs
	}
	src := s.Model
	if m.Spec.CopyOf != "" {
		src = m.Spec.CopyOf
	}
	if len(vc.Job.stagesOfKind("load_hf", func(st Stage) bool { return st.(*LoadHF).Model == src })) == 0 {
		errs = append(errs, vc.Errorf("model", "no load_hf stage loads model %q", src))
	}
	if n := len(vc.Job.stagesOfKind("apply_fsdp2", func(st Stage) bool { return st.(*ApplyFSDP2).Model == s.Model })); n > 1 {
		errs = append(errs, vc.Errorf("model", "model %q is sharded by %d apply_fsdp2 stages; shard it once", s.Model, n))
	}
	return errs
}

// Pack balances the step's samples over the dp ranks and packs micro-batches.
type Pack struct {
	MaxTokensPerGPU int `yaml:"max_tokens_per_gpu"` // 0: data.max_tokens_per_gpu
}

// Validate checks the token budget.
func (s *Pack) Validate(vc *ValidateContext) spec.Errors {
	var errs spec.Errors
	if s.MaxTokensPerGPU < 0 {
		errs = append(errs, vc.Errorf("max_tokens_per_gpu", "max_tokens_per_gpu must be positive"))
	}
	if s.MaxTokensPerGPU > 0 && s.MaxTokensPerGPU < vc.Job.Spec.Data.MaxSeqLen {
		errs = append(errs, vc.Errorf("max_tokens_per_gpu", "max_tokens_per_gpu %d is below data.max_seq_len %d: the longest sample would not fit", s.MaxTokensPerGPU, vc.Job.Spec.Data.MaxSeqLen))
	}
	return errs
}

// Tokens is the micro-batch token budget.
func (s *Pack) Tokens(sp *spec.Spec) int {
	if s.MaxTokensPerGPU > 0 {
		return s.MaxTokensPerGPU
	}
	return sp.Data.MaxTokensPerGPU
}

// LogProb computes per-token log-probs (ref_logprob, actor_logprob).
type LogProb struct {
	Model           string `yaml:"model"`
	ChunkTokens     int    `yaml:"chunk_tokens"`
	Entropy         bool   `yaml:"entropy"`
	EntropyTempered bool   `yaml:"entropy_tempered"` // entropy of softmax(z/T) instead of softmax(z)
}

// Validate checks the model and the chunk size.
func (s *LogProb) Validate(vc *ValidateContext) spec.Errors {
	_, errs := vc.sharded("model", s.Model)
	if s.ChunkTokens < 1 {
		errs = append(errs, vc.Errorf("chunk_tokens", "chunk_tokens must be at least 1, got %d", s.ChunkTokens))
	}
	errs = append(errs, vc.needsPack()...)
	return errs
}

// UpdateRef copies one model's weights into another.
type UpdateRef struct {
	From string `yaml:"from"`
	To   string `yaml:"to"`
}

// Validate checks both models are sharded and have the same architecture.
func (s *UpdateRef) Validate(vc *ValidateContext) spec.Errors {
	from, errs := vc.sharded("from", s.From)
	to, e := vc.sharded("to", s.To)
	errs = append(errs, e...)
	if from != nil && to != nil && from.Config.NumParams() != to.Config.NumParams() {
		errs = append(errs, vc.Errorf("to", "model %q (%d params) and %q (%d params) differ in shape", s.From, from.Config.NumParams(), s.To, to.Config.NumParams()))
	}
	return errs
}

// model resolves a model name given under key.
func (vc *ValidateContext) model(key, name string) (*Model, spec.Errors) {
	if name == "" {
		return nil, spec.Errors{vc.Errorf(key, "%s is required", key)}
	}
	for _, sm := range vc.Job.Spec.Models {
		if sm.Name == name {
			m := vc.Job.Models[name]
			if m == nil {
				return nil, nil // its load error is already reported
			}
			return m, nil
		}
	}
	var names []string
	for _, sm := range vc.Job.Spec.Models {
		names = append(names, sm.Name)
	}
	return nil, spec.Errors{vc.Errorf(key, "unknown model %q (models: %v)", name, names)}
}

// sharded resolves a model that an apply_fsdp2 stage must shard.
func (vc *ValidateContext) sharded(key, name string) (*Model, spec.Errors) {
	m, errs := vc.model(key, name)
	if m == nil {
		return nil, errs
	}
	if len(vc.Job.stagesOfKind("apply_fsdp2", func(st Stage) bool { return st.(*ApplyFSDP2).Model == name })) == 0 {
		errs = append(errs, vc.Errorf(key, "model %q is not sharded by any apply_fsdp2 stage", name))
	}
	return m, errs
}

func (vc *ValidateContext) needsPack() spec.Errors {
	if len(vc.Job.stagesOfKind("pack", nil)) == 0 {
		return spec.Errors{spec.Errorf(vc.Stage.UsesPos, "stage %q: %s needs packed micro-batches, but stages.step has no pack stage", vc.Stage.ID, vc.Stage.Uses)}
	}
	return nil
}
