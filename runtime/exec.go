package runtime

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/rlpipe/rlpipe/spec"
)

// Status is what became of one stage in an Execute call.
type Status string

// The statuses of a stage.
const (
	StatusRan     Status = "ran"     // run returned nil
	StatusSkipped Status = "skipped" // its `when` was false
	StatusNotRun  Status = "not run" // an earlier stage failed or the context ended first
	StatusFailed  Status = "failed"  // run (or its `when`) returned an error
)

// StageResult records one stage of an Execute call.
type StageResult struct {
	ID       string
	Uses     string
	Status   Status
	Reason   string        // why a stage was skipped or not run, e.g. "upstream b failed"
	Err      error         // the error of a failed stage
	Duration time.Duration // time spent in run (and in evaluating `when`)
}

// Report is what Execute did, stage by stage, in execution order.
type Report struct {
	Phase    spec.Phase
	Stages   []StageResult
	Failed   string // id of the stage that failed; empty when none did
	Duration time.Duration
}

// Result returns the result of the stage with the given id, or nil.
func (r *Report) Result(id string) *StageResult {
	for i := range r.Stages {
		if r.Stages[i].ID == id {
			return &r.Stages[i]
		}
	}
	return nil
}

// String renders the report as an aligned table, one line per stage with its
// status, the duration of stages that ran or failed, and the reason or error.
func (r *Report) String() string {
	rows := make([][]string, 0, len(r.Stages))
	for _, s := range r.Stages {
		row := []string{s.ID, s.Uses, string(s.Status), ""}
		if s.Status == StatusRan || s.Status == StatusFailed {
			row[3] = s.Duration.Round(time.Microsecond).String()
		}
		switch {
		case s.Err != nil:
			row = append(row, s.Err.Error())
		case s.Reason != "":
			row = append(row, s.Reason)
		}
		rows = append(rows, row)
	}
	return fmt.Sprintf("%s:\n", r.Phase) + table("  ", rows)
}

// PanicError is the error Execute returns for a stage whose run panicked.
type PanicError struct {
	Value any
	Stack []byte
}

// Error describes the panic; the stack is in the Stack field.
func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// Execute runs the stages of one phase of g, one after another in
// topological order, calling run for each. env gives the environment a
// stage's `when` is evaluated in; it may be nil, and may return nil, for the
// zero Env.
//
// A stage whose `when` is false is skipped and its dependents still run. The
// first failure stops the phase: the remaining stages are recorded as not run,
// and the error, which wraps the cause, names the stage that failed with its
// kind and position. Execute checks ctx before each stage and passes it to
// run; when ctx ends it returns an error wrapping ctx.Err(). A panic in run is
// recovered and returned as a *PanicError. The report is returned in every
// case.
func Execute(ctx context.Context, g *Graph, phase spec.Phase, env func(*Node) *spec.Env, run func(context.Context, *Node) error) (*Report, error) {
	rep := &Report{Phase: phase}
	if g == nil {
		return rep, errors.New("execute: no graph")
	}
	if run == nil {
		return rep, errors.New("execute: no run function")
	}
	if phase != spec.Setup && phase != spec.Step {
		return rep, fmt.Errorf("execute: unknown phase %q", phase)
	}
	start := time.Now()
	defer func() { rep.Duration = time.Since(start) }()

	order := g.Order(phase)
	for i, n := range order {
		res := StageResult{ID: n.Stage.ID, Uses: n.Stage.Uses}
		if err := ctx.Err(); err != nil {
			if cause := context.Cause(ctx); cause != nil && cause != err {
				err = fmt.Errorf("%w (%w)", err, cause)
			}
			notRun(rep, order[i:], nil, "canceled")
			return rep, fmt.Errorf("%s phase stopped before stage %q: %w", phase, n.Stage.ID, err)
		}

		t0 := time.Now()
		var e *spec.Env
		if env != nil {
			e = env(n)
		}
		ok, err := active(n, e)
		if err == nil && !ok {
			res.Status = StatusSkipped
			res.Reason = "when false: " + n.Stage.When.Src
			res.Duration = time.Since(t0)
			rep.Stages = append(rep.Stages, res)
			continue
		}
		if err == nil {
			err = protect(ctx, n, run)
		}
		res.Duration = time.Since(t0)
		if err != nil {
			res.Status = StatusFailed
			res.Err = err
			rep.Stages = append(rep.Stages, res)
			rep.Failed = n.Stage.ID
			notRun(rep, order[i+1:], n, "")
			return rep, fmt.Errorf("stage %q (%s) at %s: %w", n.Stage.ID, n.Stage.Uses, n.Stage.Pos, err)
		}
		res.Status = StatusRan
		rep.Stages = append(rep.Stages, res)
	}
	return rep, nil
}

// protect calls run, turning a panic into a *PanicError.
func protect(ctx context.Context, n *Node, run func(context.Context, *Node) error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return run(ctx, n)
}

// notRun records the stages in rest as not run. When failed is set, the
// reason names it: "upstream <id> failed" for stages that depend on it,
// directly or not, and "stopped after <id> failed" for the others.
func notRun(rep *Report, rest []*Node, failed *Node, reason string) {
	down := map[*Node]bool{}
	if failed != nil {
		var mark func(*Node)
		mark = func(n *Node) {
			for _, d := range n.Dependents {
				if !down[d] {
					down[d] = true
					mark(d)
				}
			}
		}
		mark(failed)
	}
	for _, n := range rest {
		r := reason
		if failed != nil {
			if down[n] {
				r = fmt.Sprintf("upstream %s failed", failed.Stage.ID)
			} else {
				r = fmt.Sprintf("stopped after %s failed", failed.Stage.ID)
			}
		}
		rep.Stages = append(rep.Stages, StageResult{ID: n.Stage.ID, Uses: n.Stage.Uses, Status: StatusNotRun, Reason: r})
	}
}
