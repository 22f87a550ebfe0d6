package bench

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/rlpipe/rlpipe/spec"
)

// TestTinyCPU runs the harness end to end on the tiny Qwen2 config and the
// CPU backend: every timed step is measured, the arena high-water equals the
// plan's peak (the marks add no memory), and the loss metrics are finite.
func TestTinyCPU(t *testing.T) {
	for _, offload := range []bool{false, true} {
		o := DefaultOptions()
		o.Config = "../examples/models/tiny-qwen2/config.json"
		o.TokensPerSeq, o.PromptTokens, o.Chunk = 48, 8, 32
		o.Warmup, o.Steps = 1, 2
		o.Offload = offload
		o.WorkDir = t.TempDir()
		var progress int
		o.Progress = func(*Result) { progress++ }
		r, err := Run(context.Background(), o)
		if err != nil {
			t.Fatalf("offload=%v: %v", offload, err)
		}
		if r.Status != "ok" || r.StepsDone != 3 || len(r.Train.TimesS) != 2 || len(r.RefLogprob.TimesS) != 2 {
			t.Fatalf("offload=%v: status %s, steps %d, train %v, ref %v", offload, r.Status, r.StepsDone, r.Train.TimesS, r.RefLogprob.TimesS)
		}
		if progress != 4 {
			t.Errorf("offload=%v: progress called %d times, want 4", offload, progress)
		}
		if r.Train.TokensPerS <= 0 || r.RefLogprob.TokensPerS <= 0 || r.Train.Tokens != 8*48 {
			t.Errorf("offload=%v: train %+v ref %+v", offload, r.Train, r.RefLogprob)
		}
		if r.Memory.ArenaHighWaterBytes != r.Memory.PlanPeakBytes {
			t.Errorf("offload=%v: arena high-water %d != plan peak %d", offload, r.Memory.ArenaHighWaterBytes, r.Memory.PlanPeakBytes)
		}
		if offload && r.Memory.PlanHostPinnedBytes < 16*r.Model.Params {
			t.Errorf("offload: host pinned %d < 16 B/param × %d", r.Memory.PlanHostPinnedBytes, r.Model.Params)
		}
		if _, ok := r.LastMetrics["loss"]; !ok {
			t.Errorf("offload=%v: no loss in %v", offload, r.LastMetrics)
		}
		if !strings.Contains(r.SpecYAML, "uses: "+markKind) {
			t.Errorf("spec has no marks:\n%s", r.SpecYAML)
		}
	}
}

func TestUnknownBackend(t *testing.T) {
	o := DefaultOptions()
	o.Config = "../examples/models/tiny-qwen2/config.json"
	o.Backend = "cuda-nope"
	r, err := Run(context.Background(), o)
	if err == nil || r.Status != "failed" || !strings.Contains(r.Error, "unknown backend") {
		t.Fatalf("got %v, status %q", err, r.Status)
	}
}

// TestOverlapReduceCPU runs the harness at dp 2 on the CPU with
// --overlap-reduce false, true and auto (the default): the spec writes
// what was given, the metrics are the same, the plan holds more with it
// (the reductions' buffers live one unit longer), the arena high-water is
// still the plan's peak, and auto is the plan's choice of true (the job
// fits on the host either way) with true's plan.
func TestOverlapReduceCPU(t *testing.T) {
	res := map[spec.AutoBool]*Result{}
	for _, c := range []struct {
		overlap spec.AutoBool
		written string // in the spec; "" for none
	}{
		{spec.AutoBoolOf(false), "overlap_reduce: false"},
		{spec.AutoBoolOf(true), "overlap_reduce: true"},
		{spec.BoolAuto, ""},
	} {
		o := DefaultOptions()
		o.Config = "../examples/models/tiny-qwen2/config.json"
		o.TokensPerSeq, o.PromptTokens, o.Chunk = 48, 8, 32
		o.Warmup, o.Steps, o.DP = 1, 1, 2
		o.OverlapReduce = c.overlap
		o.WorkDir = t.TempDir()
		r, err := Run(context.Background(), o)
		if err != nil {
			t.Fatalf("overlap=%v: %v", c.overlap, err)
		}
		if r.Memory.ArenaHighWaterBytes != r.Memory.PlanPeakBytes {
			t.Errorf("overlap=%v: arena high-water %d != plan peak %d", c.overlap, r.Memory.ArenaHighWaterBytes, r.Memory.PlanPeakBytes)
		}
		if got := strings.Contains(r.SpecYAML, "overlap_reduce"); got != (c.written != "") || c.written != "" && !strings.Contains(r.SpecYAML, c.written) || r.Workload.OverlapReduce != c.overlap {
			t.Errorf("overlap=%v: spec writes overlap_reduce %v (want %q), workload %v", c.overlap, got, c.written, r.Workload.OverlapReduce)
		}
		var chose []string
		for _, ch := range r.Workload.Auto {
			if ch.Key == "overlap_reduce" {
				chose = append(chose, ch.Subject+" "+ch.Value)
			}
		}
		if want := map[bool][]string{true: {"model actor true"}}[c.overlap.IsAuto()]; !slices.Equal(chose, want) {
			t.Errorf("overlap=%v: the plan chose overlap_reduce %q, want %q", c.overlap, chose, want)
		}
		res[c.overlap] = r
	}
	off, on, auto := res[spec.AutoBoolOf(false)], res[spec.AutoBoolOf(true)], res[spec.BoolAuto]
	for _, r := range []*Result{on, auto} {
		if a, b := off.LastMetrics, r.LastMetrics; a["loss"] != b["loss"] || a["grad_norm"] != b["grad_norm"] {
			t.Errorf("metrics %v without overlap_reduce, %v with (workload %v)", a, b, r.Workload.OverlapReduce)
		}
	}
	if on.Memory.PlanPeakBytes <= off.Memory.PlanPeakBytes || auto.Memory.PlanPeakBytes != on.Memory.PlanPeakBytes {
		t.Errorf("plan peak %d with overlap_reduce, %d without, %d auto", on.Memory.PlanPeakBytes, off.Memory.PlanPeakBytes, auto.Memory.PlanPeakBytes)
	}
}

// TestTimelineCPU runs the benchmark at dp 2 on the CPU with a timeline
// file and checks the result's summary and the Chrome trace written: one
// complete event per span, on the compute and side streams, the gathers
// on the side, the summary's waits the sum of its parts.
func TestTimelineCPU(t *testing.T) {
	o := DefaultOptions()
	o.Config = "../examples/models/tiny-qwen2/config.json"
	o.TokensPerSeq, o.PromptTokens, o.Chunk = 48, 8, 32
	o.Warmup, o.Steps, o.DP = 1, 1, 2
	o.WorkDir = t.TempDir()
	o.TimelineFile = filepath.Join(o.WorkDir, "trace.json")
	r, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	tl := r.Timeline
	if tl == nil || tl.Step != 2 || tl.SpanS <= 0 || tl.SideS <= 0 || tl.SideS > tl.SpanS {
		t.Fatalf("timeline summary %+v", tl)
	}
	var sum float64
	for _, w := range tl.WaitByOp {
		sum += w
	}
	if math.Abs(sum-tl.WaitS) > 1e-12 {
		t.Errorf("waits by op sum to %v, total %v", sum, tl.WaitS)
	}
	data, err := os.ReadFile(o.TimelineFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []struct {
			Name, Ph, Tid string
			Ts, Dur       float64
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	streams := map[string]int{}
	gathers := 0
	for _, e := range doc.TraceEvents {
		if e.Ph != "X" || e.Ts < 0 || e.Dur < 0 || e.Ts+e.Dur > tl.SpanS*1e6+1e-3 {
			t.Errorf("event %+v (step span %v s)", e, tl.SpanS)
		}
		streams[e.Tid]++
		if e.Tid == "side" && strings.HasPrefix(e.Name, "gather ") {
			gathers++
		}
	}
	if streams["compute"] == 0 || gathers == 0 {
		t.Errorf("events per stream %v, %d gathers on the side stream", streams, gathers)
	}
}

// countingMeter is an energy counter that goes up by one joule a read.
type countingMeter struct {
	mu sync.Mutex
	j  float64
}

func (m *countingMeter) Joules() (float64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.j++
	return m.j, nil
}

// TestEnergyCPU runs the tiny benchmark with an energy counter that counts
// its reads: rank 0 reads it at the end of each step (of the warm-up's last
// and each timed one), so two timed steps take two joules, one a step;
// without a meter (the CPU), or without a warm-up step, there is no energy.
func TestEnergyCPU(t *testing.T) {
	for _, c := range []struct {
		metered bool
		warmup  int
	}{{false, 1}, {true, 1}, {true, 0}} {
		o := DefaultOptions()
		o.Config = "../examples/models/tiny-qwen2/config.json"
		o.TokensPerSeq, o.PromptTokens, o.Chunk = 48, 8, 32
		o.Warmup, o.Steps = c.warmup, 2
		o.WorkDir = t.TempDir()
		if c.metered {
			o.meter = &countingMeter{}
		}
		r, err := Run(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		e := r.Energy
		switch {
		case !c.metered || c.warmup == 0:
			if e != nil {
				t.Errorf("metered %v, warm-up %d: energy %+v", c.metered, c.warmup, *e)
			}
			if c.metered && r.EnergyNote == "" {
				t.Error("no energy without a warm-up step, and no note saying why")
			}
		case e == nil:
			t.Error("no energy with a meter")
		case e.Joules != 2 || e.Steps != 2 || e.JoulesPerStep != 1 || e.Seconds <= 0 || e.Watts != 2/e.Seconds:
			t.Errorf("energy %+v, want 2 J over 2 steps", *e)
		}
	}
}
