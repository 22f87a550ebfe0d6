package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/jobs"
	"github.com/rlpipe/rlpipe/model"
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

// TestRunResumeExport runs the embedded default in two halves (--steps, then
// --resume) and whole, and checks that the halves reproduce the whole run,
// that the record holds what it should, and that the export is a valid HF
// checkpoint.
func TestRunResumeExport(t *testing.T) {
	whole, halves := t.TempDir(), t.TempDir()
	if code, out, errs := runCLI(t, "run", "--runs", whole, tinySpec); code != exitOK {
		t.Fatalf("run exit %d\n%s%s", code, out, errs)
	}
	code, out, errs := runCLI(t, "run", "--runs", halves, "--steps", "5", tinySpec)
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
	a, err := onlyRun(t, whole).Metrics()
	if err != nil {
		t.Fatal(err)
	}
	b, err := onlyRun(t, halves).Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 12 || len(b) != 12 {
		t.Fatalf("metrics lines: whole %d, resumed %d; want 12", len(a), len(b))
	}
	for i := range a {
		if a[i].Step != b[i].Step || a[i].Loss != b[i].Loss || a[i].GradNorm != b[i].GradNorm || a[i].KL != b[i].KL {
			t.Errorf("step %d: resumed run differs: loss %v/%v grad_norm %v/%v kl %v/%v", a[i].Step, b[i].Loss, a[i].Loss, b[i].GradNorm, a[i].GradNorm, b[i].KL, a[i].KL)
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
	code, out, _ = runCLI(t, "jobs", "list", "--runs", whole)
	if code != exitOK || !strings.Contains(out, r.ID()[:8]) || !strings.Contains(out, "succeeded") {
		t.Errorf("jobs list: exit %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, "jobs", "show", "--runs", whole, r.ID()[:8])
	if code != exitOK || !strings.Contains(out, "adv_logp=") || !strings.Contains(out, "ckpts    steps 6, 12") {
		t.Errorf("jobs show: exit %d\n%s", code, out)
	}
}
