package stages

import (
	"context"
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/runtime/plan"
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
// that gather each parameter (replicaSync).
func (s *UpdateRef) Plan(pc *PlanContext) error { return pc.run(s.program) }

// Run copies the shards.
func (s *UpdateRef) Run(ctx context.Context, rc *RunContext) error { return rc.run(ctx, s.program) }

func (s *UpdateRef) program(p *prog) {
	from, _ := p.in("source").(*ShardState)
	to, _ := p.in("target").(*ShardState)
	if from != nil && to != nil && to.World == 1 && from.World > 1 {
		s.replicaSync(p, from, to)
		p.out("weights", to)
		return
	}
	p.op(fmt.Sprintf("copy %s shards into %s", s.From, s.To))
	p.do(func() error { return copyParams(p.r.B, to, from) })
	p.out("weights", to)
}

// replicaSync copies sharded model from into replica to: parameter by
// parameter, each rank casts its rows to to's dtype (send), the ranks
// all-gather them (full, padded as in from's gathered layout), and the
// parameter's rows go into the replica. The values are those a gather of
// from computes with.
func (s *UpdateRef) replicaSync(p *prog, from, to *ShardState) {
	if len(from.Units) != len(to.Units) {
		p.fail(fmt.Errorf("copying %s into %s: %d units against %d", s.From, s.To, len(from.Units), len(to.Units)))
		return
	}
	var shard, padded int64
	for _, u := range from.Units {
		for _, sl := range u.Slots {
			if !sl.Tied {
				shard, padded = max(shard, sl.ShardElems()), max(padded, sl.PaddedElems())
			}
		}
	}
	p.op(fmt.Sprintf("gather %s into the replica %s", s.From, s.To))
	// F32, the widest dtype a frozen model stores: the buffers hold any.
	send := p.buf(p.stage.ID+".send", plan.Comm, gpu.F32, int(shard))
	full := p.buf(p.stage.ID+".full", plan.Comm, gpu.F32, int(padded))
	p.do(func() error {
		b := p.r.B
		for i, u := range from.Units {
			v := to.Units[i]
			for _, sl := range u.Slots {
				if sl.Tied {
					continue // the embedding's unit holds it
				}
				k := slotIndex(v, sl.Name)
				if k < 0 {
					return fmt.Errorf("copying %s into %s: the replica's unit %s has no %s", s.From, s.To, v.Name, sl.Name)
				}
				src, err := from.paramShard(u, sl)
				if err != nil {
					return err
				}
				dst, err := to.paramShard(v, v.Slots[k])
				if err != nil {
					return err
				}
				snd, err := section(send.t, 0, v.Master, sl.ShardElems())
				if err != nil {
					return err
				}
				all, err := section(full.t, 0, v.Master, sl.PaddedElems())
				if err != nil {
					return err
				}
				if err := b.Copy(snd, src); err != nil {
					return fmt.Errorf("%s: %w", sl.Name, err)
				}
				if err := p.r.Comm.AllGather(p.ctx, all, snd); err != nil {
					return fmt.Errorf("%s: all-gather: %w", sl.Name, err)
				}
				rows, err := all.Flat(0, int(sl.Elems()))
				if err == nil {
					err = b.Copy(dst, rows)
				}
				if err != nil {
					return fmt.Errorf("%s: %w", sl.Name, err)
				}
			}
		}
		return nil
	})
}
