package bench

import (
	"fmt"
	"io"
	"time"

	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/stages"
)

// TimelineSummary is rank 0's timeline of a step, in seconds: how long
// the compute stream stood waiting for the side stream (gathers and, with
// overlap_reduce, reductions), in all and per stage and what it waited
// for ("ref_logp: gather"), how long the side stream was busy, how long
// the Down stream was (grads to the host, with the optimizer state
// offloaded), and the step's span on the device.
type TimelineSummary struct {
	Step     int                `json:"step"`
	SpanS    float64            `json:"span_s"`
	SideS    float64            `json:"side_s"`
	DownS    float64            `json:"down_s,omitempty"`
	WaitS    float64            `json:"wait_s"`
	WaitByOp map[string]float64 `json:"wait_by_op_s"` // by stage and side op waited for
	// OpS is the compute stream's time by stage and op kind
	// ("ref_logp: gate_up"); IdleS, by stage, the time it had no op
	// before the stage's first (StepTimeline.Ops, Idle).
	OpS   map[string]float64 `json:"op_s"`
	IdleS map[string]float64 `json:"idle_s"`
}

// summarizeTimeline sums step's timeline.
func summarizeTimeline(step int, tl *stages.StepTimeline) *TimelineSummary {
	s := &TimelineSummary{Step: step, SpanS: tl.Span.Seconds(), SideS: tl.Side.Seconds(), DownS: tl.Down.Seconds(),
		WaitByOp: seconds(tl.Wait), OpS: seconds(tl.Ops), IdleS: seconds(tl.Idle)}
	for _, w := range tl.Wait {
		s.WaitS += w.Seconds()
	}
	return s
}

// seconds returns m in seconds.
func seconds(m map[string]time.Duration) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, d := range m {
		out[k] = d.Seconds()
	}
	return out
}

// writeTrace writes step's timeline (rank 0's) to path as a Chrome
// trace, atomically.
func writeTrace(path string, step int, tl *stages.StepTimeline) error {
	err := model.WriteFileAtomic(path, 0o644, func(w io.Writer) error { return tl.WriteTrace(w, 0, step) })
	if err != nil {
		return fmt.Errorf("timeline: %w", err)
	}
	return nil
}
