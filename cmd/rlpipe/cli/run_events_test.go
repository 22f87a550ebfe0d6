package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/jobs"
)

// eventLines parses JSON lines: each must be an object with an event (or
// at least a message). It returns the objects and their events, a run of
// the same event collapsed into one (setup progress comes in any number).
func eventLines(t *testing.T, what, text string) ([]map[string]any, []string) {
	t.Helper()
	var objs []map[string]any
	var events []string
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		var obj map[string]any
		if err := json.Unmarshal([]byte(line), &obj); err != nil {
			t.Fatalf("%s line %d is not a JSON object: %v\n%s", what, i+1, err, line)
		}
		if _, ok := obj["message"].(string); !ok {
			t.Errorf("%s line %d has no message: %s", what, i+1, line)
		}
		ev, _ := obj["event"].(string)
		if ev == "" {
			if obj["level"] == "info" {
				t.Errorf("%s line %d: an info line without an event: %s", what, i+1, line)
			}
			continue
		}
		objs = append(objs, obj)
		if len(events) == 0 || events[len(events)-1] != ev {
			events = append(events, ev)
		}
	}
	return objs, events
}

// setupEvents are the lifecycle events of the setup of examples/tiny-*.yaml
// (three stages, too quick for progress lines).
var setupEvents = []string{
	"setup_stage_started", "setup_stage_finished", "setup_stage_started", "setup_stage_finished",
	"setup_stage_started", "setup_stage_finished", "setup_finished",
}

// TestRunEvents runs the embedded default for two steps with --json;
// planned for an H100 and stopped by a signal after its first step; and
// canceled before its setup. It checks what each prints: the run's
// lifecycle events as JSON lines on stdout (with --json), the same in
// the run log, and on stderr the announcement (with a warning when the
// H100's job runs on the CPU), the setup's and the steps' progress with
// the RL metrics (without --json) and the summary.
func TestRunEvents(t *testing.T) {
	root := t.TempDir()
	code, out, errs := runCLI(t, "run", "--json", "--runs", root, "--steps", "2", tinySpec)
	if code != exitOK {
		t.Fatalf("run --json: exit %d\n%s%s", code, out, errs)
	}
	objs, events := eventLines(t, "stdout", out)
	want := slices.Concat([]string{"run_started"}, setupEvents, []string{"step", "checkpoint_saved", "export_written", "run_finished"})
	if !slices.Equal(events, want) {
		t.Errorf("run --json events\n%q\nwant\n%q", events, want)
	}
	byEvent := map[string]map[string]any{}
	for _, o := range objs {
		byEvent[o["event"].(string)] = o
	}
	rec := onlyRun(t, root)
	for _, c := range []struct{ event, key string }{
		{"run_started", "id"}, {"run_started", "dir"}, {"run_started", "backend"}, {"run_started", "devices"}, {"run_started", "ranks"},
		{"setup_stage_finished", "seconds"}, {"setup_stage_finished", "bytes"},
		{"step", "metrics"}, {"run_finished", "tokens"}, {"run_finished", "seconds"}, {"export_written", "dir"},
	} {
		if _, ok := byEvent[c.event][c.key]; !ok {
			t.Errorf("event %s has no %s: %v", c.event, c.key, byEvent[c.event])
		}
	}
	if id := byEvent["run_started"]["id"]; id != rec.ID() {
		t.Errorf("run_started id %v, want %s", id, rec.ID())
	}
	if m, _ := byEvent["step"]["metrics"].(map[string]any); m["step"] != 2.0 || m["loss"] == nil || m["kl"] == nil || m["entropy"] == nil || m["clipfrac"] == nil {
		t.Errorf("the last step event's metrics: %v", m)
	}
	if strings.Contains(errs, "step 1/") || !strings.Contains(errs, "rlpipe: devices: ") || !strings.Contains(errs, "stopped: steps 1-2 of 12") {
		t.Errorf("with --json, stderr has the announcement and the summary, no progress:\n%s", errs)
	}
	_, logged := eventLines(t, "run log", readText(t, filepath.Join(rec.Dir(), jobs.LogFileName)))
	if !slices.Equal(logged, events) {
		t.Errorf("the run log's events\n%q\nwant those of stdout\n%q", logged, events)
	}

	t.Run("stopped", func(t *testing.T) {
		root := t.TempDir()
		var sout, serr bytes.Buffer
		env := newCLI(&sout, &serr)
		env.stop.Store(true)
		if code := env.main(context.Background(), []string{"run", "--runs", root, "--gpu", "h100-80g", tinySpec}); code != exitCanceled {
			t.Fatalf("exit %d\n%s%s", code, sout.String(), serr.String())
		}
		errs := serr.String()
		onCPU := strings.Contains(errs, " on cpu: ")
		if warned := strings.Contains(errs, "rlpipe: warning: no CUDA device found, so the CPU backend runs this job planned for h100-80g (--gpu, "); warned != onCPU {
			t.Errorf("on the CPU: %v; warned that the job planned for a GPU runs there: %v\n%s", onCPU, warned, errs)
		}
		for _, s := range []string{"setup 1/3 load (load_hf actor): started\n", "setup 2/3 shard_actor: done in ", " 26 tensors\n",
			"step 1/12 (8%) loss=", " kl=", " entropy=", " clipfrac=", " tok/s="} {
			if !strings.Contains(errs, s) {
				t.Errorf("stderr has no %q:\n%s", s, errs)
			}
		}
		_, logged := eventLines(t, "run log", readText(t, filepath.Join(onlyRun(t, root).Dir(), jobs.LogFileName)))
		want := slices.Concat([]string{"run_started"}, setupEvents, []string{"step", "checkpoint_saved", "run_stopped"})
		if onCPU {
			want = append([]string{"backend_fallback"}, want...)
		}
		if !slices.Equal(logged, want) {
			t.Errorf("the run log's events\n%q\nwant\n%q", logged, want)
		}
	})

	t.Run("failed", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var sout, serr bytes.Buffer
		code := newCLI(&sout, &serr).main(ctx, []string{"run", "--json", "--runs", t.TempDir(), tinySpec})
		if code != exitCanceled {
			t.Fatalf("exit %d\n%s%s", code, sout.String(), serr.String())
		}
		objs, events := eventLines(t, "stdout", sout.String())
		if !slices.Equal(events, []string{"run_started", "run_failed"}) || objs[1]["error"] == nil || objs[1]["status"] != "canceled" {
			t.Errorf("events %q, last %v; want the run started, then failed with its error", events, objs[len(objs)-1])
		}
		if n := strings.Count(serr.String(), " failed: "); n != 1 {
			t.Errorf("stderr tells the failure %d times, want once:\n%s", n, serr.String())
		}
	})
}
