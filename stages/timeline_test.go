package stages

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rt "github.com/rlpipe/rlpipe/runtime"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
)

// TestTimeline runs the tiny recipe at dp 2 (with overlap_reduce, so that
// both gathers and reductions run on the side stream) on the CPU with the
// timeline on, and checks each step's: the same metrics as without it,
// every op of the step's program on the compute stream in program order,
// spans within the step, a gather or reduction on the side stream for
// every unit, and the waits for the side stream named by stage and side
// op, summed without the units' layers.
func TestTimeline(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-dp2.yaml")
	short := func(s *spec.Spec) { s.Train.Steps = 2 }
	on := variant(t, path, "      with: {model: actor}\n    - id: shard_ref", "      with: {model: actor, overlap_reduce: true, gather_once: false}\n    - id: shard_ref")
	base := runParsed(t, on, short, nil, RunOptions{})
	on = variant(t, path, "      with: {model: actor}\n    - id: shard_ref", "      with: {model: actor, overlap_reduce: true, gather_once: false}\n    - id: shard_ref")
	out := runParsed(t, on, short, nil, RunOptions{TimelineEvery: 1})
	if len(out.steps) != 2 {
		t.Fatalf("%d steps", len(out.steps))
	}
	for _, sr := range out.steps {
		// The ops of the step's stages that ran (update_ref runs every
		// other step).
		var stepOps, opStages, ran []string
		for _, st := range out.p.Stages {
			if res := sr.Report.Result(st.ID); st.Phase == string(spec.Step) && res != nil && res.Status == rt.StatusRan {
				ran = append(ran, st.ID)
				for _, o := range out.p.Ops[st.First : st.Last+1] {
					stepOps = append(stepOps, o.Name)
					opStages = append(opStages, st.ID)
				}
			}
		}
		b := base.steps[sr.Step-1]
		if sr.Stats.GradNorm != b.Stats.GradNorm || sr.Stats.Values["loss"] != b.Stats.Values["loss"] {
			t.Errorf("step %d: grad norm %v loss %v with the timeline, %v %v without", sr.Step, sr.Stats.GradNorm, sr.Stats.Values["loss"], b.Stats.GradNorm, b.Stats.Values["loss"])
		}
		if base.steps[sr.Step-1].Timeline != nil {
			t.Errorf("step %d: a timeline without RunOptions.TimelineEvery", sr.Step)
		}
		tl := sr.Timeline
		if tl == nil {
			t.Fatalf("step %d: no timeline", sr.Step)
		}
		var compute, computeStages, side []string
		ops := map[string]time.Duration{}
		last := tl.Spans[0].Start
		for _, s := range tl.Spans {
			if s.Start < 0 || s.Dur < 0 || s.Start+s.Dur > tl.Span {
				t.Errorf("step %d: span %+v outside the step's %v", sr.Step, s, tl.Span)
			}
			switch s.Stream {
			case "compute":
				if s.Start < last {
					t.Errorf("step %d: %q starts before the op before it", sr.Step, s.Name)
				}
				last = s.Start
				compute = append(compute, s.Name)
				computeStages = append(computeStages, s.Stage)
				ops[s.Stage+": "+opKind(s.Name)] += s.Dur
			case "side":
				side = append(side, s.Name)
			case "compute wait":
				stage, what, ok := strings.Cut(s.Name, ": ")
				isStage := slices.ContainsFunc(out.p.Stages, func(st plan.StageSpan) bool { return st.ID == stage })
				if !ok || !isStage || !slices.Contains(side, what) {
					t.Errorf("step %d: a wait for %q, not a stage's wait for a side op before it", sr.Step, s.Name)
				}
			default:
				t.Errorf("step %d: span %+v on stream %q", sr.Step, s, s.Stream)
			}
		}
		if !slices.Equal(compute, stepOps) {
			t.Errorf("step %d: the compute stream's spans\n%q\nare not the step's ops\n%q", sr.Step, compute, stepOps)
		}
		if !slices.Equal(computeStages, opStages) {
			t.Errorf("step %d: the compute spans' stages\n%q\nare not their ops'\n%q", sr.Step, computeStages, opStages)
		}
		// Ops sums the compute spans by stage and op kind; Idle is the
		// time before each stage's first op but the step's first.
		if len(ops) != len(tl.Ops) {
			t.Errorf("step %d: %d op sums, want %d", sr.Step, len(tl.Ops), len(ops))
		}
		for k, d := range ops {
			if tl.Ops[k] != d || strings.Contains(k, "layer") {
				t.Errorf("step %d: ops %q = %v, its spans sum to %v", sr.Step, k, tl.Ops[k], d)
			}
		}
		for k, d := range tl.Idle {
			if !slices.Contains(ran[1:], k) || d < 0 {
				t.Errorf("step %d: idle %v before %q, not a stage after the step's first", sr.Step, d, k)
			}
		}
		if len(tl.Idle) != len(ran)-1 {
			t.Errorf("step %d: idle times %v for the %d stages after the first of %q", sr.Step, tl.Idle, len(ran)-1, ran)
		}
		for _, want := range []string{"gather layer0", "gather layer1 for backward", "reduce-scatter grads layer0", "reduce-scatter grads embed"} {
			if !slices.ContainsFunc(side, func(n string) bool { return strings.HasPrefix(n, want) }) {
				t.Errorf("step %d: no %q on the side stream: %q", sr.Step, want, side)
			}
		}
		var waited int64
		for k, w := range tl.Wait {
			if strings.Contains(k, "layer") || w < 0 {
				t.Errorf("step %d: wait %v under %q", sr.Step, w, k)
			}
			waited += int64(w)
		}
		t.Logf("step %d: %d spans over %v, side busy %v, compute waited %v: %v", sr.Step, len(tl.Spans), tl.Span, tl.Side, waited, tl.Wait)
	}
}

// TestTimelineDown runs the tiny recipe with the actor offloaded (params
// and optimizer state on the host) and the timeline on: every unit's
// grads cross to the host on the Down stream, whose spans and busy time
// the timeline reports, and every wait the compute stream records names a
// side or Down op before it.
func TestTimelineDown(t *testing.T) {
	offloaded := variant(t, filepath.Join("..", "examples", "tiny-grpo.yaml"),
		"  recompute: 'layer.index % 2 == 0'\n", "  recompute: 'layer.index % 2 == 0'\n  offload: 'model.trainable'\n  offload_optimizer: 'model.trainable'\n")
	out := runParsed(t, offloaded, func(s *spec.Spec) { s.Train.Steps = 1 }, nil, RunOptions{TimelineEvery: 1})
	if len(out.steps) != 1 || out.steps[0].Timeline == nil {
		t.Fatalf("%d steps, or no timeline", len(out.steps))
	}
	tl := out.steps[0].Timeline
	var down, ops []string
	var busy time.Duration
	for _, s := range tl.Spans {
		switch s.Stream {
		case "down":
			down = append(down, s.Name)
			busy += s.Dur
			ops = append(ops, s.Name)
		case "side":
			ops = append(ops, s.Name)
		case "compute wait":
			if _, what, _ := strings.Cut(s.Name, ": "); !slices.Contains(ops, what) {
				t.Errorf("a wait for %q, not for a side or Down op before it", s.Name)
			}
		}
	}
	for _, want := range []string{"grads to host head", "grads to host layer1", "grads to host layer0", "grads to host embed"} {
		if !slices.Contains(down, want) {
			t.Errorf("no %q on the Down stream: %q", want, down)
		}
	}
	if tl.Down != busy || tl.Down < 0 {
		t.Errorf("Down busy %v, its spans sum to %v", tl.Down, busy)
	}
}
