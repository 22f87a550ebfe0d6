package bench

import (
	"context"
	"strings"
	"testing"
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
