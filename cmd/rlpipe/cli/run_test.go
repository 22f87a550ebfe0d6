package cli

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/jobs"
	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/stages/engines/enginetest"
)

var tinySpec = filepath.Join("..", "..", "..", "examples", "tiny-grpo.yaml")

func onlyRun(t *testing.T, root string) *jobs.Run {
	t.Helper()
	metas, err := jobs.List(root)
	if err != nil || len(metas) != 1 {
		t.Fatalf("runs under %s: %v %v", root, metas, err)
	}
	r, err := jobs.Open(root, metas[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRunResumeExport runs the embedded default whole, in two halves
// (--steps, then --resume), and stopped by a signal after its first step
// then resumed from another working directory, and checks that both
// interrupted runs reproduce the whole run, that the record holds what it
// should, that the export is a valid HF checkpoint, that a run whose
// export was lost is resumed to write it again, and that rlpipe export
// writes any committed checkpoint.
func TestRunResumeExport(t *testing.T) {
	whole, halves, signaled := t.TempDir(), t.TempDir(), t.TempDir()
	code, out, errs := runCLI(t, "run", "--runs", whole, tinySpec)
	if code != exitOK {
		t.Fatalf("run exit %d\n%s%s", code, out, errs)
	}
	// The run says where its record is as it starts, before any step.
	if first := strings.SplitN(errs, "\n", 2)[0]; !strings.HasPrefix(first, "rlpipe: run ") || !strings.Contains(first, "on cpu: 1 rank(s), dp 1; record "+whole) {
		t.Errorf("the run's first line is %q, want its record announced", first)
	}
	code, out, errs = runCLI(t, "run", "--runs", halves, "--steps", "5", tinySpec)
	if code != exitOK || !strings.Contains(out, "stopped: steps 1-5 of 12") {
		t.Fatalf("run --steps 5: exit %d\n%s%s", code, out, errs)
	}
	id := onlyRun(t, halves).ID()
	code, out, errs = runCLI(t, "run", "--runs", halves, "--resume", id[:8])
	// train.checkpoint_every is 6: the first half's last checkpoint is its
	// final step 5, so the resume starts at 6.
	if code != exitOK || !strings.Contains(out, "succeeded: steps 6-12 of 12") {
		t.Fatalf("resume: exit %d\n%s%s", code, out, errs)
	}
	// A signal during the run: the step finishes, is checkpointed, and the
	// run stops; resumed from elsewhere with the record's own spec, it
	// finishes.
	var sout, serr bytes.Buffer
	env := newCLI(&sout, &serr)
	env.stop.Store(true)
	if code := env.main(context.Background(), []string{"run", "--runs", signaled, tinySpec}); code != exitCanceled || !strings.Contains(sout.String(), "stopped: steps 1-1 of 12") {
		t.Fatalf("run with a stop signal: exit %d\n%s%s", code, sout.String(), serr.String())
	}
	stopped := onlyRun(t, signaled)
	if m := stopped.Meta(); m.Status != jobs.StatusStopped || !strings.Contains(m.Error, "signal") {
		t.Errorf("after the signal the run is %s (%q), want stopped by a signal", m.Status, m.Error)
	}
	if step, _, ok, err := stopped.LatestCheckpoint(); !ok || err != nil || step != 1 {
		t.Errorf("after the signal the latest checkpoint is step %d (%v, %v), want 1", step, ok, err)
	}
	t.Run("resume from another directory", func(t *testing.T) {
		t.Chdir(t.TempDir())
		code, out, errs := runCLI(t, "run", "--resume", stopped.Dir())
		if code != exitOK || !strings.Contains(out, "succeeded: steps 2-12 of 12") {
			t.Fatalf("exit %d\n%s%s", code, out, errs)
		}
	})
	a, err := onlyRun(t, whole).Metrics()
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{halves, signaled} {
		b, err := onlyRun(t, other).Metrics()
		if err != nil {
			t.Fatal(err)
		}
		if len(a) != 12 || len(b) != 12 {
			t.Fatalf("metrics lines: whole %d, resumed %d; want 12", len(a), len(b))
		}
		for i := range a {
			if a[i].Step != b[i].Step || a[i].Loss != b[i].Loss || a[i].GradNorm != b[i].GradNorm || a[i].KL != b[i].KL || a[i].Updates != 1 {
				t.Errorf("step %d: resumed run differs: loss %v/%v grad_norm %v/%v kl %v/%v updates %d", a[i].Step, b[i].Loss, a[i].Loss, b[i].GradNorm, a[i].GradNorm, b[i].KL, a[i].KL, a[i].Updates)
			}
		}
		ups, err := onlyRun(t, other).Updates()
		if err != nil || len(ups) != 12 || ups[11].Update != 12 || ups[11].Loss != a[11].Loss {
			t.Errorf("updates.jsonl: %d lines (%v), last %+v; want one per step, equal to the step's", len(ups), err, ups[len(ups)-1])
		}
	}
	if first, last := a[0].Extra["adv_logp"], a[11].Extra["adv_logp"]; !(last > first) {
		t.Errorf("adv_logp did not rise: %v -> %v", first, last)
	}
	r := onlyRun(t, whole)
	for _, f := range []string{jobs.SpecFile, jobs.ResolvedFile, jobs.PlanFile, jobs.MetricsFile, jobs.LogFileName} {
		if st, err := os.Stat(filepath.Join(r.Dir(), f)); err != nil || st.Size() == 0 {
			t.Errorf("run record lacks %s: %v", f, err)
		}
	}
	exp := filepath.Join(r.Dir(), "export", "actor")
	cfg, err := model.LoadConfig(exp)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := model.OpenCheckpoint(exp)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if err := ck.Check(cfg); err != nil {
		t.Errorf("exported checkpoint: %v", err)
	}
	// The export holds the trained weights, not the initial ones.
	init, err := model.OpenCheckpoint(filepath.Join("..", "..", "..", "examples", "models", "tiny-qwen2"))
	if err != nil {
		t.Fatal(err)
	}
	defer init.Close()
	x, y := make([]float32, 64), make([]float32, 64)
	if err := ck.ReadRows("model.layers.0.mlp.up_proj.weight", 0, 1, x); err != nil {
		t.Fatal(err)
	}
	if err := init.ReadRows("model.layers.0.mlp.up_proj.weight", 0, 1, y); err != nil {
		t.Fatal(err)
	}
	same := true
	for i := range x {
		same = same && x[i] == y[i]
	}
	if same {
		t.Error("exported weights equal the initial checkpoint's")
	}
	// The export lost after training finished (killed while writing it):
	// resume writes it again, from the last checkpoint, identical.
	exported := readAll(t, filepath.Join(exp, "model.safetensors"))
	if err := os.RemoveAll(exp); err != nil {
		t.Fatal(err)
	}
	if err := r.SetExported(""); err != nil {
		t.Fatal(err)
	}
	if err := r.SetStatus(jobs.StatusFailed, errors.New("killed while exporting")); err != nil {
		t.Fatal(err)
	}
	code, out, errs = runCLI(t, "run", "--resume", r.Dir())
	if code != exitOK || !strings.Contains(out, "training had finished at step 12") {
		t.Fatalf("resume to finish the export: exit %d\n%s%s", code, out, errs)
	}
	if again := readAll(t, filepath.Join(exp, "model.safetensors")); !bytes.Equal(again, exported) {
		t.Error("the export written from the checkpoint differs from the run's own")
	}
	if code, out, errs = runCLI(t, "run", "--resume", r.Dir()); code != exitInvalid && code != exitFailed {
		t.Errorf("resuming a succeeded run: exit %d\n%s%s", code, out, errs)
	}
	// rlpipe export: any committed checkpoint, on the host.
	code, out, errs = runCLI(t, "export", "--step", "6", r.Dir())
	if code != exitOK || !strings.Contains(out, "at step 6") {
		t.Fatalf("export --step 6: exit %d\n%s%s", code, out, errs)
	}
	step6 := filepath.Join(r.Dir(), "export", "actor-step-6")
	if _, err := model.OpenCheckpoint(step6); err != nil {
		t.Errorf("export --step 6: %v", err)
	}
	if code, _, errs = runCLI(t, "export", "--step", "5", r.Dir()); code != exitFailed || !strings.Contains(errs, "committed: [6 12]") {
		t.Errorf("export --step 5 (no checkpoint): exit %d\n%s", code, errs)
	}
	code, out, _ = runCLI(t, "jobs", "list", "--runs", whole)
	if code != exitOK || !strings.Contains(out, r.ID()[:8]) || !strings.Contains(out, "succeeded") {
		t.Errorf("jobs list: exit %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, "jobs", "show", "--runs", whole, r.ID()[:8])
	if code != exitOK || !strings.Contains(out, "adv_logp=") || !strings.Contains(out, "ckpts    steps 6, 12") {
		t.Errorf("jobs show: exit %d\n%s", code, out)
	}
}

func readAll(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPPORecipe runs examples/tiny-ppo.yaml, 8 updates per step, and reads
// updates.jsonl: each step's first update has ratio 1, no clipping and no
// PPO KL; later updates of the step move the ratio and clip.
func TestPPORecipe(t *testing.T) {
	root := t.TempDir()
	ppo := filepath.Join("..", "..", "..", "examples", "tiny-ppo.yaml")
	if code, out, errs := runCLI(t, "run", "--runs", root, ppo); code != exitOK {
		t.Fatalf("run exit %d\n%s%s", code, out, errs)
	}
	r := onlyRun(t, root)
	ups, err := r.Updates()
	if err != nil {
		t.Fatal(err)
	}
	steps, err := r.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if len(ups) != 32 || len(steps) != 4 || steps[0].Updates != 8 {
		t.Fatalf("%d update lines, %d step lines (%d updates in step 1); want 32, 4 and 8", len(ups), len(steps), steps[0].Updates)
	}
	for step := 1; step <= 4; step++ {
		clipped, moved := false, false
		for _, u := range ups[(step-1)*8 : step*8] {
			if u.Step != step {
				t.Fatalf("update %d is in step %d, want %d", u.Update, u.Step, step)
			}
			ratio := u.Extra["ratio"]
			if u.Epoch == 1 && u.MiniBatch == 1 {
				if math.Abs(ratio-1) > 1e-6 || u.ClipFrac != 0 || u.Extra["ppo_kl"] != 0 {
					t.Errorf("step %d's first update: ratio %v, clipfrac %v, ppo_kl %v; want 1, 0, 0", step, ratio, u.ClipFrac, u.Extra["ppo_kl"])
				}
				continue
			}
			moved = moved || math.Abs(ratio-1) > 1e-4
			clipped = clipped || u.ClipFrac > 0
		}
		if !moved || !clipped {
			t.Errorf("step %d: after the first update the ratio moved: %v, tokens clipped: %v", step, moved, clipped)
		}
	}
}

// TestLiveRecipe runs the first steps of the embedded default, the live
// loop: the progress line shows each step's reward, and metrics.jsonl
// records the reward of the step's fresh rollouts.
func TestLiveRecipe(t *testing.T) {
	root := t.TempDir()
	live := filepath.Join("..", "..", "..", "examples", "tiny-live.yaml")
	code, out, errs := runCLI(t, "run", "--runs", root, "--steps", "2", live)
	if code != exitOK || !strings.Contains(errs, "step 2/12") || !strings.Contains(errs, " reward=") {
		t.Fatalf("run exit %d, want the progress of 2 steps with their reward\n%s%s", code, out, errs)
	}
	steps, err := onlyRun(t, root).Metrics()
	if err != nil || len(steps) != 2 {
		t.Fatalf("%d step lines (%v), want 2", len(steps), err)
	}
	for _, m := range steps {
		r, ok := m.Extra["reward_mean"]
		if !ok || !(r > 0 && r < 1) || m.Extra["response_length_mean"] != 16 {
			t.Errorf("step %d: reward_mean %v (recorded %v), response_length_mean %v; want a mean in (0, 1) of 16-token responses", m.Step, r, ok, m.Extra["response_length_mean"])
		}
	}
}

// TestColocatedRecipe runs examples/tiny-colocated.yaml against a test
// SGLang engine: 2 steps whole, and 1 step then resumed. The first run
// ends asleep, so its checkpoint and export are read from the host copy of
// the trainer's state; the resumed run trains exactly as the whole one.
func TestColocatedRecipe(t *testing.T) {
	srv := enginetest.NewSGLang(enginetest.SmallVocab)
	defer srv.Close()
	ex, err := filepath.Abs(filepath.Join("..", "..", "..", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	src := readText(t, filepath.Join(ex, "tiny-colocated.yaml"))
	dir := t.TempDir()
	for _, r := range [][2]string{
		{"http://127.0.0.1:30000", srv.URL},
		{"path: models/tiny-qwen2", "path: " + filepath.Join(ex, "models", "tiny-qwen2")},
		{"prompts: data/tiny-prompts.jsonl", "prompts: " + filepath.Join(ex, "data", "tiny-prompts.jsonl")},
		{"/tmp/tiny-colocated-policy", filepath.Join(dir, "policy")},
	} {
		if !strings.Contains(src, r[0]) {
			t.Fatalf("tiny-colocated.yaml has no %q", r[0])
		}
		src = strings.ReplaceAll(src, r[0], r[1])
	}
	recipe := filepath.Join(dir, "colocated.yaml")
	if err := os.WriteFile(recipe, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	whole, halves := t.TempDir(), t.TempDir()
	if code, out, errs := runCLI(t, "run", "--runs", whole, "--steps", "2", recipe); code != exitOK {
		t.Fatalf("run exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := runCLI(t, "run", "--runs", halves, "--steps", "1", recipe); code != exitOK {
		t.Fatalf("run --steps 1: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := runCLI(t, "run", "--runs", halves, "--steps", "2", "--resume", onlyRun(t, halves).ID()); code != exitOK {
		t.Fatalf("resume: exit %d\n%s%s", code, out, errs)
	}
	a, err := onlyRun(t, whole).Metrics()
	if err != nil || len(a) != 2 {
		t.Fatalf("%d step lines (%v)", len(a), err)
	}
	b, err := onlyRun(t, halves).Metrics()
	if err != nil || len(b) != 2 {
		t.Fatalf("%d step lines after the resume (%v)", len(b), err)
	}
	for i := range a {
		if a[i].Loss != b[i].Loss || a[i].GradNorm != b[i].GradNorm {
			t.Errorf("step %d: loss %v, grad_norm %v whole; %v, %v resumed", i+1, a[i].Loss, a[i].GradNorm, b[i].Loss, b[i].GradNorm)
		}
		if a[i].Extra["sleep_gb"] <= 0 || a[i].Extra["asleep_plan_bytes"] <= 0 {
			t.Errorf("step %d: sleep_gb %v, asleep_plan_bytes %v", i+1, a[i].Extra["sleep_gb"], a[i].Extra["asleep_plan_bytes"])
		}
	}
	if a[1].Extra["wake_gb"] != a[0].Extra["sleep_gb"] {
		t.Errorf("step 2 woke %v GB, step 1 slept %v", a[1].Extra["wake_gb"], a[0].Extra["sleep_gb"])
	}
	ea := readText(t, filepath.Join(onlyRun(t, whole).Dir(), "export", "actor", "model.safetensors"))
	eb := readText(t, filepath.Join(onlyRun(t, halves).Dir(), "export", "actor", "model.safetensors"))
	if ea != eb || ea == "" {
		t.Error("the resumed run's export differs from the whole run's")
	}
}

func readText(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
