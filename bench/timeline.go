package bench

import (
	"fmt"
	"io"

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
}

// summarizeTimeline sums step's timeline.
func summarizeTimeline(step int, tl *stages.StepTimeline) *TimelineSummary {
	s := &TimelineSummary{Step: step, SpanS: tl.Span.Seconds(), SideS: tl.Side.Seconds(), DownS: tl.Down.Seconds(), WaitByOp: map[string]float64{}}
	for k, w := range tl.Wait {
		s.WaitByOp[k] = w.Seconds()
		s.WaitS += w.Seconds()
	}
	return s
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
