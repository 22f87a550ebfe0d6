package stages

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
)

// A step's timeline (RunOptions.TimelineEvery): timed events recorded, without
// syncing, on the rank's compute stream at every op's start and around
// every wait for the side stream, and on the side stream around each
// gather and each reduction run there. Once the step is over their times
// give when the device reached each point, so the timeline shows what
// overlapped and how long the compute stream stood waiting for the side
// stream: the communication the step did not hide. The profile
// (RunOptions.Profile) syncs at every op instead, which serialises the
// streams.

// timedStream is a stream that records timed events: gpu/cuda's and
// gpu/cpu's.
type timedStream interface {
	RecordTimed() (gpu.Event, error)
}

// timedEvent is an event from RecordTimed.
type timedEvent interface {
	Since(start gpu.Event) (time.Duration, error)
}

// Span is one interval of a step's timeline, from the step's first mark.
type Span struct {
	Name   string        `json:"name"`
	Stream string        `json:"stream"`          // "compute", "compute wait" (for the side or Down stream), "side" or "down"
	Stage  string        `json:"stage,omitempty"` // the stage of a compute span's op
	Start  time.Duration `json:"start_ns"`
	Dur    time.Duration `json:"dur_ns"`
}

// StepTimeline is a rank's timeline of one step.
type StepTimeline struct {
	Spans []Span
	// Wait is the time the compute stream stood waiting for the side
	// stream, per stage and kind of side op waited for, without units:
	// "ref_logp: gather", "train: gather for backward", "train:
	// reduce-scatter grads".
	Wait map[string]time.Duration
	// Side is the time the side stream was busy (gathers and reductions).
	Side time.Duration
	// Down is the time the Down stream was busy copying grads to the host
	// (offloaded optimizer state).
	Down time.Duration
	// Span is the time from the step's first mark to its last.
	Span time.Duration
	// Ops is the compute stream's time per stage and kind of op, without
	// units' layers ("ref_logp: gate_up"): from each op's start to the
	// next's, so a wait inside an op counts in it.
	Ops map[string]time.Duration
	// Idle is, per stage, the time the compute stream had no op between
	// the end of the stage before it in the step and the stage's first op:
	// the host's work between the two, which the device did not overlap.
	Idle map[string]time.Duration
}

// markKind says what a mark records.
type markKind int

const (
	markOp        markKind = iota // the compute stream reached an op (its name; "" ends a stage)
	markWait                      // the compute stream reached a wait for the side stream (what it waits for)
	markWaited                    // the wait ended
	markSideStart                 // the side stream started a gather or reduction
	markSideEnd                   // it finished
	markDownStart                 // the Down stream started copying a unit's grads to the host
	markDownEnd                   // it finished
)

type mark struct {
	kind  markKind
	name  string
	stage string // markOp: the op's stage
	ev    gpu.Event
}

// timeline collects a rank's marks during a step.
type timeline struct {
	marks []mark
}

// mark records a timed event of kind on s (the compute stream for markOp,
// markWait and markWaited, the side stream for markSideStart and
// markSideEnd, the Down stream for markDownStart and markDownEnd).
func (t *timeline) mark(s gpu.Stream, kind markKind, name string) error {
	return t.markStage(s, kind, name, "")
}

// markStage is mark with the stage of a markOp.
func (t *timeline) markStage(s gpu.Stream, kind markKind, name, stage string) error {
	ts, ok := s.(timedStream)
	if !ok {
		return fmt.Errorf("timeline: stream %T records no times", s)
	}
	ev, err := ts.RecordTimed()
	if err != nil {
		return fmt.Errorf("timeline: %w", err)
	}
	t.marks = append(t.marks, mark{kind: kind, name: name, stage: stage, ev: ev})
	return nil
}

// collect waits for the step's marks (b synced), turns them into the
// step's timeline and releases them.
func (t *timeline) collect(b gpu.Backend) (*StepTimeline, error) {
	defer func() {
		for _, m := range t.marks {
			m.ev.Close()
		}
		t.marks = t.marks[:0]
	}()
	if len(t.marks) == 0 {
		return newStepTimeline(), nil
	}
	if err := b.Sync(); err != nil {
		return nil, err
	}
	at := make([]time.Duration, len(t.marks))
	var errs []error
	for i, m := range t.marks {
		te, ok := m.ev.(timedEvent)
		if !ok {
			return nil, fmt.Errorf("timeline: event %T holds no time", m.ev)
		}
		d, err := te.Since(t.marks[0].ev)
		errs = append(errs, err)
		at[i] = d
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("timeline: %w", err)
	}
	st := newStepTimeline()
	lastOp, lastStage, opAt, waitAt := "", "", time.Duration(0), time.Duration(-1)
	endAt := time.Duration(-1) // the end of the step's last stage so far
	var side, down openSpan
	for i, m := range t.marks {
		st.Span = max(st.Span, at[i])
		switch m.kind {
		case markOp:
			if lastOp != "" {
				d := at[i] - opAt
				st.Spans = append(st.Spans, Span{Name: lastOp, Stream: "compute", Stage: lastStage, Start: opAt, Dur: d})
				st.Ops[lastStage+": "+opKind(lastOp)] += d
			}
			switch {
			case m.name == "":
				endAt = at[i]
			case lastOp == "" && endAt >= 0:
				st.Idle[m.stage] += at[i] - endAt
			}
			lastOp, lastStage, opAt = m.name, m.stage, at[i]
		case markWait:
			waitAt = at[i]
		case markWaited:
			if w := at[i] - waitAt; waitAt >= 0 && w > 0 {
				st.Spans = append(st.Spans, Span{Name: m.name, Stream: "compute wait", Start: waitAt, Dur: w})
				st.Wait[opKind(m.name)] += w
			}
			waitAt = -1
		case markSideStart:
			side = openSpan{m.name, at[i]}
		case markSideEnd:
			st.Side += st.closeSpan(&side, "side", at[i])
		case markDownStart:
			down = openSpan{m.name, at[i]}
		case markDownEnd:
			st.Down += st.closeSpan(&down, "down", at[i])
		}
	}
	return st, nil
}

// newStepTimeline returns a timeline with no span, wait or op yet.
func newStepTimeline() *StepTimeline {
	return &StepTimeline{Wait: map[string]time.Duration{}, Ops: map[string]time.Duration{}, Idle: map[string]time.Duration{}}
}

// openSpan is a side or Down stream span whose end is not reached yet
// (name "": none).
type openSpan struct {
	name string
	at   time.Duration
}

// closeSpan appends the span o opened on stream, ending at end, and
// returns its length (0 when none is open).
func (t *StepTimeline) closeSpan(o *openSpan, stream string, end time.Duration) time.Duration {
	if o.name == "" {
		return 0
	}
	d := end - o.at
	t.Spans = append(t.Spans, Span{Name: o.name, Stream: stream, Start: o.at, Dur: d})
	o.name = ""
	return d
}

// traceEvent is an event of the Chrome trace format: a complete event
// ("X") of a process (the rank) and thread (the stream), times in
// microseconds.
type traceEvent struct {
	Name string            `json:"name"`
	Ph   string            `json:"ph"`
	Ts   float64           `json:"ts"`
	Dur  float64           `json:"dur"`
	Pid  int               `json:"pid"`
	Tid  string            `json:"tid"`
	Args map[string]string `json:"args,omitempty"` // "stage" of a compute span
}

// WriteTrace writes the timeline, rank's of step, as a Chrome trace (for
// chrome://tracing or Perfetto): an event per span, its stream the thread.
func (t *StepTimeline) WriteTrace(w io.Writer, rank, step int) error {
	evs := make([]traceEvent, 0, len(t.Spans))
	for _, sp := range t.Spans {
		ev := traceEvent{Name: sp.Name, Ph: "X", Ts: float64(sp.Start.Nanoseconds()) / 1e3, Dur: float64(sp.Dur.Nanoseconds()) / 1e3, Pid: rank, Tid: sp.Stream}
		if sp.Stage != "" {
			ev.Args = map[string]string{"stage": sp.Stage}
		}
		evs = append(evs, ev)
	}
	doc := struct {
		TraceEvents []traceEvent      `json:"traceEvents"`
		Metadata    map[string]string `json:"metadata"`
	}{evs, map[string]string{"rlpipe": fmt.Sprintf("rank %d, step %d", rank, step)}}
	return json.NewEncoder(w).Encode(doc)
}
