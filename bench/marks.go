package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
)

// The harness times the step stages with "bench_mark" stages placed between
// them in the job it builds: pack → mark start → ref_logprob → mark ref →
// train → mark train. A mark waits for the rank's backend (Backend.Sync, so
// every op issued so far has completed on the device) and records the wall
// clock. The ref_logprob time of a step is mark ref − mark start; the train
// time is mark train − mark ref. A mark declares no op and no buffer: the
// planner gives it a "noop" op, and the plan's peak and arena are those of
// the job without marks.
const markKind = "bench_mark"

func init() {
	stages.Register(stages.Kind{Name: markKind, Phase: spec.Step,
		Doc: "benchmark harness: sync the backend and record the wall clock (bench/)",
		New: func() stages.Stage { return &markStage{} }})
}

// markStage is the parameter struct of a bench_mark stage.
type markStage struct {
	Recorder string `yaml:"run"`  // the recorder of this benchmark run
	Mark     string `yaml:"mark"` // the name of the mark
}

// Ports declares none: a mark reads and writes no data.
func (s *markStage) Ports(*spec.Spec) stages.Ports { return stages.Ports{} }

func (s *markStage) Validate(vc *stages.ValidateContext) spec.Errors {
	if s.Recorder == "" || s.Mark == "" {
		return spec.Errors{spec.Errorf(vc.Stage.UsesPos, "%s needs run and mark", markKind)}
	}
	return nil
}

// Plan declares nothing: the mark allocates no device memory.
func (s *markStage) Plan(*stages.PlanContext) error { return nil }

// Run syncs the rank's backend and records the time.
func (s *markStage) Run(_ context.Context, rc *stages.RunContext) error {
	if err := rc.Rank.B.Sync(); err != nil {
		return fmt.Errorf("bench mark %s: sync: %w", s.Mark, err)
	}
	t := time.Now()
	rec := recorderOf(s.Recorder)
	if rec == nil {
		return fmt.Errorf("bench mark %s: no recorder %q", s.Mark, s.Recorder)
	}
	rec.set(rc.Rank.ID, rc.Rank.Step, s.Mark, t)
	return nil
}

type markKey struct {
	rank, step int
	mark       string
}

// recorder holds the marks of one benchmark run.
type recorder struct {
	mu sync.Mutex
	at map[markKey]time.Time
}

func (r *recorder) set(rank, step int, mark string, t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.at[markKey{rank, step, mark}] = t
}

func (r *recorder) get(rank, step int, mark string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.at[markKey{rank, step, mark}]
	return t, ok
}

// between is the time from mark a to mark b of a step on a rank.
func (r *recorder) between(rank, step int, a, b string) (time.Duration, error) {
	ta, ok1 := r.get(rank, step, a)
	tb, ok2 := r.get(rank, step, b)
	if !ok1 || !ok2 {
		return 0, fmt.Errorf("step %d: marks %q/%q missing", step, a, b)
	}
	return tb.Sub(ta), nil
}

var (
	recordersMu sync.Mutex
	recorders   = map[string]*recorder{}
)

func newRecorder(id string) *recorder {
	recordersMu.Lock()
	defer recordersMu.Unlock()
	r := &recorder{at: map[markKey]time.Time{}}
	recorders[id] = r
	return r
}

func recorderOf(id string) *recorder {
	recordersMu.Lock()
	defer recordersMu.Unlock()
	return recorders[id]
}

func dropRecorder(id string) {
	recordersMu.Lock()
	defer recordersMu.Unlock()
	delete(recorders, id)
}
