package bench

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/stages"
)

// TimelineSummary is rank 0's timeline of a step, in seconds: how long
// the compute stream stood waiting for the side stream (gathers and, with
// overlap_reduce, reductions), in all and per stage and what it waited
// for ("ref_logp: gather"), how long the side stream was busy, and the
// step's span on the device.
type TimelineSummary struct {
	Step     int                `json:"step"`
	SpanS    float64            `json:"span_s"`
	SideS    float64            `json:"side_s"`
	WaitS    float64            `json:"wait_s"`
	WaitByOp map[string]float64 `json:"wait_by_op_s"` // by stage and side op waited for
}

// summarizeTimeline sums step's timeline.
func summarizeTimeline(step int, tl *stages.StepTimeline) *TimelineSummary {
	s := &TimelineSummary{Step: step, SpanS: tl.Span.Seconds(), SideS: tl.Side.Seconds(), WaitByOp: map[string]float64{}}
	for k, w := range tl.Wait {
		s.WaitByOp[k] = w.Seconds()
		s.WaitS += w.Seconds()
	}
	return s
}

// traceEvent is an event of the Chrome trace format: a complete event
// ("X") of a thread (one per stream), times in microseconds.
type traceEvent struct {
	Name string  `json:"name"`
	Ph   string  `json:"ph"`
	Ts   float64 `json:"ts"`
	Dur  float64 `json:"dur"`
	Pid  int     `json:"pid"`
	Tid  string  `json:"tid"`
}

// writeTrace writes step's timeline to path as a Chrome trace, atomically.
func writeTrace(path string, step int, tl *stages.StepTimeline) error {
	evs := make([]traceEvent, 0, len(tl.Spans))
	for _, sp := range tl.Spans {
		evs = append(evs, traceEvent{Name: sp.Name, Ph: "X", Ts: float64(sp.Start.Nanoseconds()) / 1e3, Dur: float64(sp.Dur.Nanoseconds()) / 1e3, Pid: 0, Tid: sp.Stream})
	}
	doc := struct {
		TraceEvents []traceEvent      `json:"traceEvents"`
		Metadata    map[string]string `json:"metadata"`
	}{evs, map[string]string{"rlpipe": fmt.Sprintf("rank 0, step %d", step)}}
	err := model.WriteFileAtomic(path, 0o644, func(w io.Writer) error { return json.NewEncoder(w).Encode(doc) })
	if err != nil {
		return fmt.Errorf("timeline: %w", err)
	}
	return nil
}
