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
// the job without marks. Where the recorder has an energy meter (rank 0's
// GPU), rank 0's "train" marks also read the GPU's energy counter, after
// the time: the steps' energy is the counter's difference between two of
// them, and no timed stage holds a read.
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
	if rc.Rank.ID == 0 && rec.meter != nil && s.Mark == "train" {
		j, err := rec.meter.Joules()
		if err != nil {
			return fmt.Errorf("bench mark %s: %w", s.Mark, err)
		}
		rec.setJoules(rc.Rank.Step, s.Mark, j)
	}
	return nil
}

// energyMeter reads a GPU's energy counter (nvml.EnergyMeter).
type energyMeter interface {
	Joules() (float64, error)
}

type markKey struct {
	rank, step int
	mark       string
}

// recorder holds the marks of one benchmark run and, where it has a
// meter, rank 0's energy counter at each.
type recorder struct {
	mu     sync.Mutex
	at     map[markKey]time.Time
	meter  energyMeter
	joules map[markKey]float64
}

func (r *recorder) setJoules(step int, mark string, j float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.joules[markKey{0, step, mark}] = j
}

// energy is rank 0's energy from the "train" mark of step from to that of
// step to (steps count from 1: the first read ends step 1); ok is false
// where the recorder has no meter.
func (r *recorder) energy(from, to int) (e Energy, ok bool, err error) {
	if r.meter == nil {
		return e, false, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ja, ok1 := r.joules[markKey{0, from, "train"}]
	jb, ok2 := r.joules[markKey{0, to, "train"}]
	ta, ok3 := r.at[markKey{0, from, "train"}]
	tb, ok4 := r.at[markKey{0, to, "train"}]
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return e, false, fmt.Errorf("the energy at the ends of steps %d and %d is missing", from, to)
	}
	e = Energy{Joules: jb - ja, Seconds: tb.Sub(ta).Seconds(), Steps: to - from}
	if e.Steps > 0 {
		e.JoulesPerStep = e.Joules / float64(e.Steps)
	}
	if e.Seconds > 0 {
		e.Watts = e.Joules / e.Seconds
	}
	return e, true, nil
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
	r := &recorder{at: map[markKey]time.Time{}, joules: map[markKey]float64{}}
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
