package stages

import (
	"context"

	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages/rollout"
)

func init() {
	Register(Kind{Name: "pack", Phase: spec.Step,
		Doc: "balance the step's rollouts over dp ranks by tokens and pack them into varlen micro-batches",
		New: func() Stage { return &Pack{} }})
}

var _ Stage = (*Pack)(nil)

// maxTokensBound is the largest token budget a micro-batch may have.
const maxTokensBound = 1 << 24

// Pack prepares the step's rollout batch for the model: it balances the
// samples over the dp ranks by token count and packs each rank's share
// into micro-batches of at most Tokens tokens. With mesh.cp > 1 a dp rank
// is a cp group, which splits every sequence over its ranks: the budget
// counts the rows each of them holds (spec.SeqRows). Its output "batch" carries
// the budget to every stage that computes on it.
type Pack struct {
	MaxTokensPerGPU int `yaml:"max_tokens_per_gpu"` // 0: data.max_tokens_per_gpu
}

// Ports declares the rollouts input and the batch output.
func (s *Pack) Ports(*spec.Spec) Ports {
	return Ports{
		In:  []Input{{Port: Port{Name: "rollouts", Type: TypeRollouts}}},
		Out: []Port{{Name: "batch", Type: TypeBatch}},
	}
}

// Validate checks the token budget.
func (s *Pack) Validate(vc *ValidateContext) spec.Errors {
	var errs spec.Errors
	switch n := s.MaxTokensPerGPU; {
	case n < 0:
		errs = append(errs, vc.Errorf("max_tokens_per_gpu", "max_tokens_per_gpu must be positive, got %d", n))
	case n > maxTokensBound:
		errs = append(errs, vc.Errorf("max_tokens_per_gpu", "max_tokens_per_gpu must be at most %d, got %d", maxTokensBound, n))
	case n > 0 && n < spec.SeqRows(vc.Job.Spec.Data.MaxSeqLen, vc.Job.Spec.Mesh.CPSize()):
		sp := vc.Job.Spec
		if cp := sp.Mesh.CPSize(); cp > 1 {
			errs = append(errs, vc.Errorf("max_tokens_per_gpu", "max_tokens_per_gpu %d is below the %d rows data.max_seq_len %d puts on each of mesh.cp %d ranks: the longest sample would not fit",
				n, spec.SeqRows(sp.Data.MaxSeqLen, cp), sp.Data.MaxSeqLen, cp))
		} else {
			errs = append(errs, vc.Errorf("max_tokens_per_gpu", "max_tokens_per_gpu %d is below data.max_seq_len %d: the longest sample would not fit", n, sp.Data.MaxSeqLen))
		}
	}
	return errs
}

// Tokens is the micro-batch token budget: the one place it is derived.
// Every stage computing on the batch reads it from the batch.
func (s *Pack) Tokens(sp *spec.Spec) int {
	if s.MaxTokensPerGPU > 0 {
		return s.MaxTokensPerGPU
	}
	return sp.Data.MaxTokensPerGPU
}

// Plan declares the op; packing allocates no arena memory.
func (s *Pack) Plan(pc *PlanContext) error { return pc.run(s.program) }

// Run packs this rank's share of the step.
func (s *Pack) Run(ctx context.Context, rc *RunContext) error { return rc.run(ctx, s.program) }

func (s *Pack) program(p *prog) {
	p.op("pack micro-batches")
	b := &Batch{Tokens: s.Tokens(p.job.Spec)}
	rb, _ := p.in("rollouts").(*RolloutBatch)
	p.do(func() error {
		*b = *NewBatch(rb.Samples, b.Tokens)
		all := make([]int, len(rb.Samples))
		for i := range all {
			all[i] = i
		}
		m := p.job.Spec.Mesh
		plans, err := rollout.Plan(b.Rows(m.CPSize()), all, m.DP, b.Tokens)
		if err != nil {
			return err
		}
		for _, mb := range plans[p.r.dpRank(m)] {
			pk, err := b.Pack(mb)
			if err != nil {
				return err
			}
			b.Micro = append(b.Micro, pk)
		}
		return nil
	})
	p.out("batch", b)
}
