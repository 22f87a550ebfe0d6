package stages

import (
	"context"

	"github.com/rlpipe/rlpipe/runtime"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
)

// PlanContext is what a stage's Plan sees: the job, the stage entry, its
// graph node and the builder the stage appends its ops and buffers to.
type PlanContext struct {
	Job   *Job
	Stage *spec.Stage
	Node  *runtime.Node
	B     *plan.Builder
	state *planState
}

// RunContext is what a stage's Run sees on one rank.
type RunContext struct {
	Job   *Job
	Stage *spec.Stage
	Node  *runtime.Node
	Rank  *Rank
}

// planState is what planning carries from stage to stage: the plan-time
// values of the stages' outputs (a model's ShardState, a batch's token
// budget), so that a stage plans against what its inputs will be.
type planState struct {
	values values
	// asleep maps the step stages that may run while the trainer sleeps
	// to the sleep stage before them: their device buffers are resident.
	asleep map[string]string
}

func (pc *PlanContext) prog() *prog {
	return &prog{job: pc.Job, stage: pc.Stage, node: pc.Node, b: pc.B, ps: pc.state, vals: pc.state.values, ctx: context.Background()}
}

func (rc *RunContext) prog(ctx context.Context) *prog {
	return &prog{job: rc.Job, stage: rc.Stage, node: rc.Node, r: rc.Rank, vals: rc.Rank.values, ctx: ctx}
}

// run plans a stage program.
func (pc *PlanContext) run(program func(*prog)) error {
	p := pc.prog()
	program(p)
	return p.done()
}

// run executes a stage program on the context's rank.
func (rc *RunContext) run(ctx context.Context, program func(*prog)) error {
	p := rc.prog(ctx)
	program(p)
	p.fail(rc.Rank.profileOp(""))
	p.fail(rc.Rank.timelineOp(rc.Stage.ID, ""))
	return p.done()
}

// Report records a value of the step for the run's metrics (the step's
// line of metrics.jsonl, under name): what a stage measured, such as the
// mean reward of the step's rollouts. Later reports of a name replace
// earlier ones; the train stage's loss metrics take precedence.
func (rc *RunContext) Report(name string, v float64) { rc.Rank.reports[name] = v }
