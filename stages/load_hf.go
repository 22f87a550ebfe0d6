package stages

import (
	"context"
	"fmt"

	"github.com/rlpipe/rlpipe/spec"
)

func init() {
	Register(Kind{Name: "load_hf", Phase: spec.Setup,
		Doc: "read an HF checkpoint (config.json + safetensors); each rank streams only its shard",
		New: func() Stage { return &LoadHF{} }})
}

var _ Stage = (*LoadHF)(nil)

// LoadHF opens a model's HF checkpoint. Its output "checkpoint" is the
// model with its opened safetensors; apply_fsdp2 streams each rank's
// slices from it.
type LoadHF struct {
	Model string `yaml:"model"`
}

// Ports declares the checkpoint output.
func (s *LoadHF) Ports(*spec.Spec) Ports {
	return Ports{Out: []Port{{Name: "checkpoint", Type: TypeCheckpoint(s.Model)}}}
}

// Validate checks that the model exists and is read from a directory, and
// that the directory holds weights (a plan needs only config.json).
func (s *LoadHF) Validate(vc *ValidateContext) spec.Errors {
	m, errs := vc.model("model", s.Model)
	if m == nil {
		return errs
	}
	switch {
	case m.Spec.CopyOf != "":
		errs = append(errs, vc.Errorf("model", "model %q is a copy of %q and has no checkpoint to load; load %q instead", s.Model, m.Spec.CopyOf, m.Spec.CopyOf))
	case m.Checkpoint == nil && !vc.Job.check.planOnly():
		errs = append(errs, spec.Errorf(vc.Job.Spec.At("models."+s.Model+".path"), "model %q: %s has config.json but no model.safetensors or model.safetensors.index.json: rlpipe run needs the weights (rlpipe plan does not)", s.Model, m.Dir))
	}
	return errs
}

// Plan declares the op of opening the checkpoint.
func (s *LoadHF) Plan(pc *PlanContext) error { return pc.run(s.program) }

// Run checks that the model's weights are present.
func (s *LoadHF) Run(ctx context.Context, rc *RunContext) error { return rc.run(ctx, s.program) }

// program opens the checkpoint. load_hf allocates nothing: apply_fsdp2
// streams each rank's slices of it into the shards.
func (s *LoadHF) program(p *prog) {
	m := p.job.Models[s.Model]
	p.op("open checkpoint of " + s.Model)
	p.do(func() error {
		if m.Checkpoint == nil {
			return fmt.Errorf("model %q: %s has config.json but no model.safetensors: rlpipe run needs the weights", s.Model, m.Dir)
		}
		p.reportCheckpoint(m.Checkpoint)
		return nil
	})
	p.out("checkpoint", m)
}
