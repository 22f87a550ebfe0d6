package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRunTimeline runs the tiny dp 2 recipe for 4 steps with --timeline 2:
// steps 2 and 4 leave a Chrome trace in the run's timeline/ and their
// waits in the run log, the metrics are those of a run without it, and a
// negative interval is a usage error.
func TestRunTimeline(t *testing.T) {
	spec := filepath.Join("..", "..", "..", "examples", "tiny-dp2.yaml")
	plain, traced := t.TempDir(), t.TempDir()
	if code, out, errs := runCLI(t, "run", "--backend", "cpu", "--runs", plain, "--steps", "4", spec); code != exitOK {
		t.Fatalf("without --timeline: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := runCLI(t, "run", "--backend", "cpu", "--runs", traced, "--steps", "4", "--timeline", "2", spec); code != exitOK {
		t.Fatalf("--timeline 2: exit %d\n%s%s", code, out, errs)
	}
	_, b := sameRunMetrics(t, plain, traced)
	files, _ := filepath.Glob(filepath.Join(b.Dir(), "timeline", "*.json"))
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
		var doc struct {
			TraceEvents []struct{ Name, Ph, Tid string } `json:"traceEvents"`
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &doc); err != nil || len(doc.TraceEvents) == 0 {
			t.Errorf("%s: %d events (%v)", f, len(doc.TraceEvents), err)
			continue
		}
		streams := map[string]bool{}
		for _, e := range doc.TraceEvents {
			streams[e.Tid] = true
		}
		if !streams["compute"] || !streams["side"] {
			t.Errorf("%s: streams %v, want compute and side", f, streams)
		}
	}
	if !slices.Equal(names, []string{"step-000002.json", "step-000004.json"}) {
		t.Errorf("timeline files %v, want steps 2 and 4", names)
	}
	log, err := os.ReadFile(filepath.Join(b.Dir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	var waits, idle int
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, `"event":"step"`) && strings.Contains(line, `"timeline_wait_s":{`) {
			waits++
		}
		// The step's stages after the first (ref_logp, old_logp, train)
		// have their idle time.
		if strings.Contains(line, `"event":"step"`) && strings.Contains(line, `"timeline_idle_s":{`) && strings.Contains(line, `"train":`) {
			idle++
		}
	}
	if waits != 2 || idle != 2 {
		t.Errorf("%d step events with the timeline's waits and %d with its idle times, want 2 each", waits, idle)
	}
	if code, _, errs := runCLI(t, "run", "--backend", "cpu", "--runs", t.TempDir(), "--timeline", "-1", spec); code != exitUsage || !strings.Contains(errs, "--timeline") {
		t.Errorf("--timeline -1: exit %d: %s", code, errs)
	}
}
