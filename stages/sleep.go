package stages

import (
	"context"
	"fmt"
	"time"

	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages/engines"
)

func init() {
	Register(Kind{Name: "sleep", Phase: spec.Step,
		Doc: "give the GPU to a colocated engine: copy the trainer's device state to pinned host memory, release the device arena and workspaces, then resume the engine (and have it load the pushed weights)",
		New: func() Stage { return &Sleep{Model: "actor", TimeoutS: 600} }})
}

var _ Stage = (*Sleep)(nil)

// Sleep releases the trainer's device memory for a colocated inference
// engine. Every rank copies the device buffers live after the stage (the
// sharded params, grads and optimizer state, and any value a later stage
// of the step reads) into the pinned host area the plan reserves, waits
// for the copies, and releases the device arena and the backend's
// workspaces, so that only the CUDA context, the communicators and the
// resident buffers stay. Then rank 0 resumes the engine's memory (SGLang's
// /resume_memory_occupation, vLLM's /wake_up) if a wake stage released it,
// and, with `reload`, has it load the checkpoint a push_weights stage wrote
// this step. A trainer already asleep stays so. A wake stage brings it
// back; stages between may only use host memory and resident buffers (the
// generate stage with an HTTP engine does).
type Sleep struct {
	Engine string `yaml:"engine"`
	URL    string `yaml:"url"`
	// Reload names the push_weights stage whose checkpoint the engine
	// loads once resumed.
	Reload   string  `yaml:"reload"`
	Model    string  `yaml:"model"` // the model Reload pushed
	TimeoutS float64 `yaml:"timeout_s"`

	client engines.Client
}

// Ports declares the pushed checkpoint input with `reload`.
func (s *Sleep) Ports(*spec.Spec) Ports {
	if s.Reload == "" {
		return Ports{}
	}
	return Ports{In: []Input{{Port: Port{Name: "reload", Type: TypePushed(s.Model)}}}}
}

// Validate checks the engine.
func (s *Sleep) Validate(vc *ValidateContext) spec.Errors {
	c, errs := controlClient(vc, s.Engine, s.URL, s.TimeoutS)
	s.client = c
	if s.Reload != "" && s.Engine == "" {
		errs = append(errs, vc.Errorf("reload", "reload has the engine load pushed weights, but engine is not set (sglang or openai)"))
	}
	return errs
}

// Plan declares the sleep op and marks it.
func (s *Sleep) Plan(pc *PlanContext) error {
	pc.B.Op("sleep")
	pc.B.MarkSleep()
	return nil
}

// Run puts the rank's trainer to sleep and resumes the engine.
func (s *Sleep) Run(ctx context.Context, rc *RunContext) error {
	return rc.run(ctx, func(p *prog) {
		var version string
		if s.Reload != "" {
			version, _ = p.in("reload").(string)
		}
		p.op("sleep")
		r := p.r
		p.do(func() error {
			t0 := time.Now()
			n, err := r.Arena.Sleep(r.B)
			if err != nil {
				return err
			}
			reportMove(p, "sleep", n, t0)
			p.report("asleep_plan_bytes", float64(r.Arena.Plan().AsleepDeviceBytes()))
			if r.deviceMemory != nil {
				if b, ok := r.deviceMemory(); ok {
					p.report("asleep_device_bytes", float64(b))
				}
			}
			// Every rank's device memory is free before the engine takes it.
			if err := r.Comm.Barrier(p.ctx); err != nil {
				return err
			}
			if r.ID != 0 || s.client == nil {
				return nil
			}
			if r.released[s.URL] {
				t1 := time.Now()
				if err := s.client.ResumeMemory(p.ctx); err != nil {
					return fmt.Errorf("resume the engine: %w", err)
				}
				delete(r.released, s.URL)
				p.report("engine_resume_s", time.Since(t1).Seconds())
			}
			if version != "" {
				t1 := time.Now()
				if err := s.client.ReloadFromDisk(p.ctx, version); err != nil {
					return fmt.Errorf("reload %s: %w", version, err)
				}
				p.report("push_reload_s", time.Since(t1).Seconds())
			}
			return nil
		})
	})
}

// reportMove reports a sleep's or wake's copy of n bytes that started at
// t0: what_s, what_gb and what_gbps (nothing when it moved nothing).
func reportMove(p *prog, what string, n int64, t0 time.Time) {
	if n <= 0 {
		return
	}
	d := time.Since(t0).Seconds()
	p.report(what+"_s", d)
	p.report(what+"_gb", float64(n)/1e9)
	p.report(what+"_gbps", float64(n)/1e9/d)
}
