package stages

import (
	"context"

	"github.com/rlpipe/rlpipe/spec"
)

func init() {
	Register(Kind{Name: "actor_logprob", Phase: spec.Step,
		Doc: "per-token log-probs of the actor before the step's updates (the PPO old policy)",
		New: func() Stage { return &ActorLogProb{LogProb{Model: "actor", ChunkTokens: spec.Auto}} }})
}

var _ Stage = (*ActorLogProb)(nil)

// ActorLogProb computes the actor's per-token log-probs of the step's batch
// with the weights as they are before the step's first update (output
// "logp", TypeOldLogProbs): the l_old of train's ratio. With entropy: true
// it also outputs their entropies ("entropy").
type ActorLogProb struct {
	LogProb `yaml:",inline"`
}

// Ports declares the batch and weights inputs and the outputs.
func (s *ActorLogProb) Ports(*spec.Spec) Ports { return s.ports(TypeOldLogProbs, TypeOldEntropy) }

// Validate checks the parameters.
func (s *ActorLogProb) Validate(vc *ValidateContext) spec.Errors { return s.validate(vc) }

// Plan declares one micro-batch of the chunked forward.
func (s *ActorLogProb) Plan(pc *PlanContext) error { return pc.run(s.program) }

// Run computes the log-probs of every micro-batch of this rank.
func (s *ActorLogProb) Run(ctx context.Context, rc *RunContext) error { return rc.run(ctx, s.program) }
