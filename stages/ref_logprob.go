package stages

import (
	"context"

	"github.com/rlpipe/rlpipe/spec"
)

func init() {
	Register(Kind{Name: "ref_logprob", Phase: spec.Step,
		Doc: "per-token log-probs of the reference model, in token chunks",
		New: func() Stage { return &RefLogProb{LogProb{Model: "ref", ChunkTokens: spec.Auto}} }})
}

var _ Stage = (*RefLogProb)(nil)

// RefLogProb computes the reference model's per-token log-probs of the
// step's batch (output "logp", TypeRefLogProbs), which train's KL term
// reads, and with entropy: true their entropies ("entropy").
type RefLogProb struct {
	LogProb `yaml:",inline"`
}

// Ports declares the batch and weights inputs and the outputs.
func (s *RefLogProb) Ports(*spec.Spec) Ports { return s.ports(TypeRefLogProbs, TypeRefEntropy) }

// Validate checks the parameters.
func (s *RefLogProb) Validate(vc *ValidateContext) spec.Errors { return s.validate(vc) }

// Plan declares one micro-batch of the chunked forward.
func (s *RefLogProb) Plan(pc *PlanContext) error { return pc.run(s.program) }

// Run computes the log-probs of every micro-batch of this rank.
func (s *RefLogProb) Run(ctx context.Context, rc *RunContext) error { return rc.run(ctx, s.program) }
