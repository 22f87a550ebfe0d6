package stages

import (
	"context"
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/runtime"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
)

// prog runs a stage's program in one of two modes. Planning (b set), every
// op and buffer is declared on the builder and compute is skipped. Running
// (r set), every op is entered on the rank's arena, which checks that it is
// the op the plan has next, every buffer resolves to its planned view, and
// compute runs. Writing each stage once for both modes keeps the plan and the
// allocation the same thing.
type prog struct {
	job   *Job
	stage *spec.Stage
	node  *runtime.Node
	b     *plan.Builder
	ps    *planState
	r     *Rank
	vals  values // the outputs written so far: plan-time or this rank's
	ctx   context.Context
	err   error
	// unitWise says that the program reads its sharded weights unit by
	// unit through a decoder, which waits for each unit's pending host
	// update itself; other programs' weights inputs wait for the whole
	// update (ShardState.settle).
	unitWise bool
}

// ref is a buffer as the program sees it: the planned buffer while planning
// (its End may be extended as later ops are declared), the view while running.
type ref struct {
	pb *plan.Buffer
	t  gpu.Tensor
}

func (p *prog) running() bool { return p.r != nil }

// fail records the first error; later ops and compute are skipped.
func (p *prog) fail(err error) {
	if p.err == nil && err != nil {
		p.err = err
	}
}

// op declares (planning) or enters (running) the next op.
func (p *prog) op(name string) int {
	if !p.running() {
		return p.b.Op(name)
	}
	if p.err == nil {
		if err := p.ctx.Err(); err != nil {
			p.fail(err)
		} else {
			p.fail(p.r.profileOp(name))
			p.fail(p.r.timelineOp(p.stage.ID, name))
			p.fail(p.r.Arena.EnterNamed(name))
		}
	}
	return p.r.Arena.Current()
}

// now is the index of the current op.
func (p *prog) now() int {
	if !p.running() {
		return p.b.Now()
	}
	return p.r.Arena.Current()
}

// rewind goes back to op i of the current stage, to run the next micro-batch
// through the same ops.
func (p *prog) rewind(i int) {
	if p.running() && p.err == nil {
		p.fail(p.r.Arena.Rewind(i))
	}
}

func numel(shape []int) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= int64(d)
	}
	return n
}

// buf declares a device buffer live at the current op (callers extend End),
// or returns its view.
func (p *prog) buf(name string, kind plan.Kind, dt gpu.DType, shape ...int) *ref {
	return p.alloc(name, kind, false, false, dt, shape)
}

// hostBuf is buf in pinned host memory.
func (p *prog) hostBuf(name string, kind plan.Kind, dt gpu.DType, shape ...int) *ref {
	return p.alloc(name, kind, true, false, dt, shape)
}

// persistent declares a buffer that lives from now to the end of the job.
func (p *prog) persistent(name string, kind plan.Kind, host bool, dt gpu.DType, shape ...int) *ref {
	return p.alloc(name, kind, host, true, dt, shape)
}

// persistentBytes declares a persistent buffer of raw size (a byte tensor of
// mixed-dtype sections).
func (p *prog) persistentBytes(name string, kind plan.Kind, host bool, bytes int64) *ref {
	return p.alloc(name, kind, host, true, gpu.BF16, []int{int(bytes / 2)})
}

func (p *prog) alloc(name string, kind plan.Kind, host, persist bool, dt gpu.DType, shape []int) *ref {
	bytes := int64(dt.Size()) * numel(shape)
	if !p.running() {
		now := p.b.Now()
		// A stage that may run while the trainer sleeps has its device
		// buffers in the resident arena, which stays.
		resident := !host && p.ps != nil && p.ps.asleep[p.stage.ID] != ""
		switch {
		case persist:
			pb := p.b.Persistent(name, kind, bytes, host, now)
			pb.Resident = resident
			return &ref{pb: pb}
		case host:
			return &ref{pb: p.b.AllocHost(name, kind, bytes, now, now)}
		case resident:
			return &ref{pb: p.b.Resident(name, kind, bytes, now, now)}
		}
		return &ref{pb: p.b.Alloc(name, kind, bytes, now, now)}
	}
	r := &ref{pb: &plan.Buffer{}}
	if p.err == nil {
		t, err := p.r.Arena.Tensor(name, dt, shape...)
		p.fail(err)
		r.t = t
	}
	return r
}

// until extends the buffers' lifetimes to op i (planning only).
func until(i int, rs ...*ref) {
	for _, r := range rs {
		if r != nil && r.pb != nil && i > r.pb.End {
			r.pb.End = i
		}
	}
}

// do runs f when running and no error happened so far.
func (p *prog) do(f func() error) {
	if p.running() && p.err == nil {
		if err := f(); err != nil {
			p.fail(fmt.Errorf("%s: %w", p.r.Arena.Plan().Ops[p.r.Arena.Current()].Name, err))
		}
	}
}

// in returns the value of the stage's input name (see values.in): nil for
// an optional input with no producer. An error fails the program.
func (p *prog) in(name string) any {
	x, err := p.vals.in(p.node, name)
	p.fail(err)
	if st, ok := x.(*ShardState); ok && p.running() && !p.unitWise && p.err == nil {
		p.fail(st.settle())
	}
	return x
}

// report records a value of the step for the metrics (running only).
func (p *prog) report(name string, v float64) {
	if p.running() {
		p.r.reports[name] = v
	}
}

// out records the value of the stage's output name, planning and running.
func (p *prog) out(name string, v any) { p.fail(p.vals.out(p.node, name, v)) }

// done returns the program's error, naming the stage.
func (p *prog) done() error {
	if p.err != nil {
		return fmt.Errorf("stage %q: %w", p.stage.ID, p.err)
	}
	return nil
}
