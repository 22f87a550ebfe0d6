package stages

import (
	"strings"

	"github.com/rlpipe/rlpipe/spec"
)

// asleepAfter maps every step stage that may run while the trainer sleeps
// to the sleep stage before it: going back round the step (the step
// repeats), a sleep stage comes before a wake stage without `when`. A wake
// with `when` may not run, so it does not end the window. Nil without
// sleep stages or a graph.
func (j *Job) asleepAfter() map[string]string {
	if j.Graph == nil {
		return nil
	}
	order := j.Graph.Order(spec.Step)
	hasSleep := false
	for _, n := range order {
		if _, ok := j.Stages[n.Stage.ID].(*Sleep); ok {
			hasSleep = true
		}
	}
	if !hasSleep {
		return nil
	}
	out := map[string]string{}
	for i, n := range order {
		for k := 1; k <= len(order); k++ {
			m := order[(i-k+len(order))%len(order)]
			if _, ok := j.Stages[m.Stage.ID].(*Sleep); ok {
				out[n.Stage.ID] = m.Stage.ID
				break
			}
			if _, ok := j.Stages[m.Stage.ID].(*Wake); ok && m.Stage.When == nil {
				break
			}
		}
	}
	return out
}

// checkSleep reports a step stage that reads or writes a model's weights
// where the trainer may be asleep: its device state is then in host memory
// and the stage could not run.
func (j *Job) checkSleep() spec.Errors {
	asleep := j.asleepAfter()
	if len(asleep) == 0 {
		return nil
	}
	var errs spec.Errors
	for _, n := range j.Graph.Order(spec.Step) {
		after := asleep[n.Stage.ID]
		switch j.Stages[n.Stage.ID].(type) {
		case *Sleep, *Wake:
			continue
		}
		if after == "" {
			continue
		}
		var types []string
		for _, in := range n.Ports.In {
			types = append(types, in.Type)
		}
		for _, out := range n.Ports.Out {
			types = append(types, out.Type)
		}
		for _, t := range types {
			if strings.HasPrefix(t, "weights/") || t == TypeBatch {
				errs.Addf(n.Stage.UsesPos, "stage %q uses %s, but the trainer may be asleep when it runs (stage %q released the device, and no wake stage without `when` comes between): run it after a wake", n.Stage.ID, t, after)
				break
			}
		}
	}
	return errs
}
