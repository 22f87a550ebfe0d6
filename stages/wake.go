package stages

import (
	"context"
	"fmt"
	"time"

	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages/engines"
)

func init() {
	Register(Kind{Name: "wake", Phase: spec.Step,
		Doc: "take the GPU back from a colocated engine: release the engine's memory, then restore the trainer's device state from pinned host memory, bit for bit",
		New: func() Stage { return &Wake{TimeoutS: 600} }})
}

var _ Stage = (*Wake)(nil)

// Wake undoes a sleep stage. Rank 0 first asks the engine to release its
// memory (SGLang's /release_memory_occupation, vLLM's /sleep) unless it
// already did; then every rank reacquires the backend's workspaces and the
// device arena and copies the saved buffers back. A trainer already awake
// stays so (the engine is still asked to release its memory: in the first
// step the engine holds it from its start).
type Wake struct {
	Engine   string  `yaml:"engine"`
	URL      string  `yaml:"url"`
	TimeoutS float64 `yaml:"timeout_s"`

	client engines.Client
}

// Ports declares none: a wake moves no data between stages.
func (s *Wake) Ports(*spec.Spec) Ports { return Ports{} }

// Validate checks the engine.
func (s *Wake) Validate(vc *ValidateContext) spec.Errors {
	c, errs := controlClient(vc, s.Engine, s.URL, s.TimeoutS)
	s.client = c
	return errs
}

// Plan declares the wake op.
func (s *Wake) Plan(pc *PlanContext) error {
	pc.B.Op("wake")
	return nil
}

// Run releases the engine's memory and wakes the rank's trainer.
func (s *Wake) Run(ctx context.Context, rc *RunContext) error {
	return rc.run(ctx, func(p *prog) {
		p.op("wake")
		r := p.r
		p.do(func() error {
			if r.ID == 0 && s.client != nil && !r.released[s.URL] {
				t0 := time.Now()
				if err := s.client.ReleaseMemory(p.ctx); err != nil {
					return fmt.Errorf("release the engine's memory: %w", err)
				}
				r.released[s.URL] = true
				p.report("engine_release_s", time.Since(t0).Seconds())
			}
			// The engine's memory is free before any rank takes it back.
			if err := r.Comm.Barrier(p.ctx); err != nil {
				return err
			}
			t0 := time.Now()
			n, err := r.Arena.Wake(r.B)
			if err != nil {
				return err
			}
			reportMove(p, "wake", n, t0)
			return nil
		})
	})
}
