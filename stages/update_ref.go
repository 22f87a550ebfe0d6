package stages

import (
	"context"
	"fmt"

	"github.com/rlpipe/rlpipe/spec"
)

func init() {
	Register(Kind{Name: "update_ref", Phase: spec.Step,
		Doc: "copy the actor's weights into the reference model",
		New: func() Stage { return &UpdateRef{From: "actor", To: "ref"} }})
}

var _ Stage = (*UpdateRef)(nil)

// UpdateRef copies model From's weights into model To (cast to To's stored
// dtype). It reads From's weights as the step's train stage left them
// (input "source"), and To's (input "target"), and writes To's.
type UpdateRef struct {
	From string `yaml:"from"`
	To   string `yaml:"to"`
}

// Ports declares the two weights inputs and the written weights.
func (s *UpdateRef) Ports(*spec.Spec) Ports {
	return Ports{
		In: []Input{
			{Port: Port{Name: "source", Type: TypeWeights(s.From)}},
			{Port: Port{Name: "target", Type: TypeWeights(s.To)}},
		},
		Out: []Port{{Name: "weights", Type: TypeWeights(s.To)}},
	}
}

// Validate checks that both models exist, differ and have the same shape.
func (s *UpdateRef) Validate(vc *ValidateContext) spec.Errors {
	from, errs := vc.model("from", s.From)
	to, e := vc.model("to", s.To)
	errs = append(errs, e...)
	switch {
	case s.From == s.To && s.From != "":
		errs = append(errs, vc.Errorf("to", "from and to are both %q", s.To))
	case from != nil && to != nil && from.Config != nil && to.Config != nil && from.Config.NumParams() != to.Config.NumParams():
		errs = append(errs, vc.Errorf("to", "model %q (%d params) and %q (%d params) differ in shape", s.From, from.Config.NumParams(), s.To, to.Config.NumParams()))
	}
	return errs
}

// Plan declares nothing where the copy goes shard to shard in place; into
// a replica (apply_fsdp2's replicate) of a sharded model, the two buffers
// that gather each parameter (gatherReplica).
func (s *UpdateRef) Plan(pc *PlanContext) error { return pc.run(s.program) }

// Run copies the shards.
func (s *UpdateRef) Run(ctx context.Context, rc *RunContext) error { return rc.run(ctx, s.program) }

func (s *UpdateRef) program(p *prog) {
	from, _ := p.in("source").(*ShardState)
	to, _ := p.in("target").(*ShardState)
	if from != nil && to != nil && to.World == 1 && from.World > 1 {
		gatherReplica(p, from, to, fmt.Sprintf("gather %s into the replica %s", s.From, s.To))
		p.out("weights", to)
		return
	}
	p.op(fmt.Sprintf("copy %s shards into %s", s.From, s.To))
	p.do(func() error { return copyParams(p.r.B, to, from) })
	p.out("weights", to)
}
