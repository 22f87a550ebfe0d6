package jobs

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func writeCkpt(t *testing.T, r *Run, step int, files map[string]string) string {
	t.Helper()
	dir, err := r.CheckpointDir(step)
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func latest(t *testing.T, r *Run) (int, bool) {
	t.Helper()
	step, dir, ok, err := r.LatestCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	if ok && dir != r.checkpointDir(step) {
		t.Fatalf("dir = %s", dir)
	}
	return step, ok
}

func TestCheckpointCommit(t *testing.T) {
	r := newTestRun(t)
	if _, ok := latest(t, r); ok {
		t.Fatal("checkpoint in a new run")
	}
	dir := writeCkpt(t, r, 2, map[string]string{"model.safetensors": "weights", "optim/state.bin": "adam"})
	if want := filepath.Join(r.Dir(), "checkpoints", "step-2"); dir != want {
		t.Fatalf("dir = %s, want %s", dir, want)
	}
	if _, ok := latest(t, r); ok {
		t.Fatal("uncommitted checkpoint reported")
	}
	// Asking again before commit keeps what was written.
	if again, err := r.CheckpointDir(2); err != nil || again != dir {
		t.Fatalf("second CheckpointDir = %s, %v", again, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err != nil {
		t.Fatal("second CheckpointDir emptied the directory")
	}
	if err := r.CommitCheckpoint(2); err != nil {
		t.Fatal(err)
	}
	if err := r.CommitCheckpoint(2); err != nil {
		t.Fatalf("second commit: %v", err)
	}
	if step, ok := latest(t, r); !ok || step != 2 {
		t.Fatalf("latest = %d, %v", step, ok)
	}
	// A newer checkpoint still being written does not count.
	writeCkpt(t, r, 10, map[string]string{"model.safetensors": "partial"})
	if step, _ := latest(t, r); step != 2 {
		t.Fatalf("latest = %d, want 2", step)
	}
	writeCkpt(t, r, 4, map[string]string{"model.safetensors": "w4"})
	if err := r.CommitCheckpoint(4); err != nil {
		t.Fatal(err)
	}
	if step, _ := latest(t, r); step != 4 {
		t.Fatalf("latest = %d, want 4", step)
	}
	cs, err := r.Checkpoints()
	if err != nil {
		t.Fatal(err)
	}
	var steps []int
	for _, c := range cs {
		steps = append(steps, c.Step)
	}
	if !reflect.DeepEqual(steps, []int{2, 4}) {
		t.Fatalf("checkpoints = %v", steps)
	}
	wantFiles := []CheckpointFile{{"model.safetensors", 7}, {"optim/state.bin", 4}}
	if !reflect.DeepEqual(cs[0].Files, wantFiles) || cs[0].Bytes() != 11 || !cs[0].Committed.Equal(t0) {
		t.Errorf("checkpoint 2 = %+v", cs[0])
	}

	tests := []struct {
		name    string
		call    func() error
		wantErr error
	}{
		{"reopen committed", func() error { _, err := r.CheckpointDir(2); return err }, ErrCheckpointExists},
		{"commit missing", func() error { return r.CommitCheckpoint(7) }, ErrNoCheckpoint},
		{"negative", func() error { _, err := r.CheckpointDir(-1); return err }, nil},
	}
	for _, tt := range tests {
		err := tt.call()
		if err == nil || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
			t.Errorf("%s: err = %v, want %v", tt.name, err, tt.wantErr)
		}
	}

	// Stray entries in checkpoints/ are ignored.
	os.Mkdir(filepath.Join(r.Dir(), CheckpointsDir, "step-x"), 0o755)
	os.Mkdir(filepath.Join(r.Dir(), CheckpointsDir, "step-007"), 0o755)
	os.WriteFile(filepath.Join(r.Dir(), CheckpointsDir, "step-99"), nil, 0o644)
	if step, _ := latest(t, r); step != 4 {
		t.Fatalf("latest with strays = %d", step)
	}

	// Removing the newest falls back to the previous one.
	if err := r.RemoveCheckpoint(4); err != nil {
		t.Fatal(err)
	}
	if step, _ := latest(t, r); step != 2 {
		t.Fatalf("latest after remove = %d", step)
	}
}

func TestCheckpointStaleDirIsCleared(t *testing.T) {
	r := newTestRun(t)
	// A crashed process left step 3 half written.
	stale := r.checkpointDir(3)
	os.MkdirAll(stale, 0o755)
	os.WriteFile(filepath.Join(stale, "shard-7.bin"), []byte("old"), 0o644)
	dir := writeCkpt(t, r, 3, map[string]string{"shard-0.bin": "new"})
	if err := r.CommitCheckpoint(3); err != nil {
		t.Fatal(err)
	}
	cs, _ := r.Checkpoints()
	if len(cs) != 1 || !reflect.DeepEqual(cs[0].Files, []CheckpointFile{{"shard-0.bin", 3}}) {
		t.Fatalf("checkpoints = %+v", cs)
	}
	if _, err := os.Stat(filepath.Join(dir, "shard-7.bin")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale file survived: %v", err)
	}
}

func TestCheckpointDamaged(t *testing.T) {
	tests := []struct {
		name   string
		damage func(dir string)
	}{
		{"file shrunk", func(dir string) { os.WriteFile(filepath.Join(dir, "w"), []byte("x"), 0o644) }},
		{"file removed", func(dir string) { os.Remove(filepath.Join(dir, "w")) }},
		{"marker garbled", func(dir string) { os.WriteFile(filepath.Join(dir, commitMarker), []byte("{"), 0o644) }},
		{"marker of another step", func(dir string) {
			os.WriteFile(filepath.Join(dir, commitMarker), []byte(`{"step":9,"files":[]}`), 0o644)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newTestRun(t)
			dir := writeCkpt(t, r, 1, map[string]string{"w": "weights"})
			if err := r.CommitCheckpoint(1); err != nil {
				t.Fatal(err)
			}
			tt.damage(dir)
			if _, _, ok, err := r.LatestCheckpoint(); !errors.Is(err, ErrCorruptCheckpoint) || ok {
				t.Fatalf("ok = %v, err = %v; want ErrCorruptCheckpoint", ok, err)
			}
		})
	}
}

func TestResume(t *testing.T) {
	root := t.TempDir()
	r := mustCreate(t, root, t0, "12345678-0000-4000-8000-000000000001", Meta{TotalSteps: 10})
	for step := 1; step <= 6; step++ {
		for k := 1; k <= 2; k++ {
			if err := r.AppendUpdate(Metrics{Step: step, Update: 2*(step-1) + k, Epoch: 1, MiniBatch: k, Time: t0}); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.AppendMetrics(Metrics{Step: step, Updates: 2, Time: t0}); err != nil {
			t.Fatal(err)
		}
		if step == 4 || step == 6 {
			writeCkpt(t, r, step, map[string]string{"w": "weights"})
		}
		if step == 4 {
			if err := r.CommitCheckpoint(step); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Crash: step 6's checkpoint never committed; a truncated line.
	f, _ := os.OpenFile(filepath.Join(r.Dir(), MetricsFile), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"step":7,"lo`)
	f.Close()
	if err := r.AppendUpdate(Metrics{Step: 7, Update: 13}); err != nil {
		t.Fatal(err)
	}

	o, err := Open(root, "12345678")
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if _, _, _, err := o.Resume(); !errors.Is(err, ErrLocked) {
		t.Fatalf("resume while the creator holds the run: %v", err)
	}
	r.Close()
	step, dir, ok, err := o.Resume()
	if err != nil || !ok || step != 4 || dir != o.checkpointDir(4) {
		t.Fatalf("resume = %d %s %v %v", step, dir, ok, err)
	}
	ms, err := o.Metrics()
	if err != nil || len(ms) != 4 || ms[3].Step != 4 {
		t.Fatalf("metrics after resume = %v, %v", ms, err)
	}
	us, err := o.Updates()
	if err != nil || len(us) != 8 || us[7].Step != 4 || us[7].Update != 8 {
		t.Fatalf("updates after resume = %v, %v", us, err)
	}
	var dropped []int
	data, _ := o.ReadFile(DroppedUpdatesFile)
	for _, l := range strings.SplitAfter(string(data), "\n") {
		var m Metrics
		if l != "" && m.UnmarshalJSON([]byte(l)) == nil {
			dropped = append(dropped, m.Update)
		}
	}
	if !reflect.DeepEqual(dropped, []int{9, 10, 11, 12, 13}) {
		t.Errorf("dropped updates = %v", dropped)
	}
	m := o.Meta()
	if m.Status != StatusRunning || m.Resumes != 1 || m.LastStep != 4 {
		t.Errorf("meta = %+v", m)
	}
	// Continue: step 6's checkpoint dir is reused after clearing.
	if err := o.AppendMetrics(Metrics{Step: 5}); err != nil {
		t.Fatal(err)
	}
	writeCkpt(t, o, 6, map[string]string{"w": "w6"})
	if err := o.CommitCheckpoint(6); err != nil {
		t.Fatal(err)
	}
	if err := o.SetStatus(StatusSucceeded, nil); err != nil {
		t.Fatal(err)
	}
	o.Close()

	again, err := Open(root, "12345678")
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if _, _, _, err := again.Resume(); !errors.Is(err, ErrAlreadySucceeded) {
		t.Fatalf("resume of a succeeded run: %v", err)
	}
}

func TestResumeWithoutCheckpoint(t *testing.T) {
	root := t.TempDir()
	r := mustCreate(t, root, t0, "12345678-0000-4000-8000-000000000001", Meta{})
	r.AppendMetrics(Metrics{Step: 1})
	r.AppendMetrics(Metrics{Step: 2})
	r.SetStatus(StatusFailed, errors.New("boom"))
	r.Close()
	o, err := Open(root, r.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	step, dir, ok, err := o.Resume()
	if err != nil || ok || step != 0 || dir != "" {
		t.Fatalf("resume = %d %q %v %v", step, dir, ok, err)
	}
	if ms, err := o.Metrics(); len(ms) != 0 || err != nil {
		t.Fatalf("metrics = %v %v", ms, err)
	}
	m := o.Meta()
	if m.Error != "" || !m.Finished.IsZero() || m.LastStep != 0 {
		t.Errorf("meta = %+v", m)
	}
	if dropped, _ := o.ReadFile(DroppedMetricsFile); len(dropped) == 0 {
		t.Error("dropped lines not kept")
	}
}

// TestPendingExport checks what a record tells about a run whose training
// finished but whose export did not, and that Resume forgets an export
// of a step it discards.
func TestPendingExport(t *testing.T) {
	const total = 4
	tests := []struct {
		name        string
		ckpts       []int // committed checkpoints
		exportAt    int   // LastStep when SetExported is called; 0: never
		status      Status
		resume      bool
		wantStep    int // 0: none reported
		wantPending bool
		wantExport  bool // Exported still set afterwards
	}{
		{name: "no checkpoint", status: StatusFailed},
		{name: "stopped early", ckpts: []int{2}, status: StatusStopped},
		{name: "stopped early and exported", ckpts: []int{2}, exportAt: 2, status: StatusStopped, wantExport: true},
		{name: "killed while exporting", ckpts: []int{2, total}, status: StatusRunning, wantStep: total, wantPending: true},
		{name: "export failed", ckpts: []int{total}, status: StatusFailed, wantStep: total, wantPending: true},
		{name: "export of an earlier stop only", ckpts: []int{2, total}, exportAt: 2, status: StatusFailed,
			wantStep: total, wantPending: true, wantExport: true},
		{name: "exported, status not recorded", ckpts: []int{total}, exportAt: total, status: StatusRunning,
			wantStep: total, wantExport: true},
		{name: "succeeded", ckpts: []int{total}, exportAt: total, status: StatusSucceeded, wantStep: total, wantExport: true},
		{name: "succeeded without export", ckpts: []int{total}, status: StatusSucceeded, wantStep: total},
		{name: "pending after resume", ckpts: []int{2, total}, status: StatusFailed, resume: true,
			wantStep: total, wantPending: true},
		{name: "resume keeps the export of its checkpoint", ckpts: []int{total}, exportAt: total, status: StatusFailed,
			resume: true, wantStep: total, wantExport: true},
		{name: "resume forgets a later export", ckpts: []int{2}, exportAt: 3, status: StatusFailed, resume: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			r := mustCreate(t, root, t0, "12345678-0000-4000-8000-000000000001", Meta{TotalSteps: total})
			last := 0
			for _, c := range tt.ckpts {
				last = max(last, c)
			}
			last = max(last, tt.exportAt)
			for step := 1; step <= last; step++ {
				if err := r.AppendMetrics(Metrics{Step: step}); err != nil {
					t.Fatal(err)
				}
				if step == tt.exportAt {
					if err := r.SetExported(filepath.Join(r.Dir(), "export", "actor")); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, c := range tt.ckpts {
				writeCkpt(t, r, c, map[string]string{"w": "weights"})
				if err := r.CommitCheckpoint(c); err != nil {
					t.Fatal(err)
				}
			}
			if tt.status != StatusRunning {
				if err := r.SetStatus(tt.status, nil); err != nil {
					t.Fatal(err)
				}
			}
			r.Close()
			o, err := Open(root, r.ID())
			if err != nil {
				t.Fatal(err)
			}
			defer o.Close()
			if tt.resume {
				if _, _, _, err := o.Resume(); err != nil {
					t.Fatal(err)
				}
			}
			step, dir, pending, err := o.PendingExport()
			if err != nil {
				t.Fatal(err)
			}
			if step != tt.wantStep || pending != tt.wantPending {
				t.Errorf("PendingExport = step %d, pending %v; want step %d, pending %v", step, pending, tt.wantStep, tt.wantPending)
			}
			if step != 0 && dir != o.checkpointDir(step) {
				t.Errorf("dir = %s", dir)
			}
			if got := o.Meta().Exported != ""; got != tt.wantExport {
				t.Errorf("exported = %q, want set %v", o.Meta().Exported, tt.wantExport)
			}
			if stored, _ := readMeta(o.Dir()); (stored.Exported != "") != tt.wantExport {
				t.Errorf("stored exported = %q, want set %v", stored.Exported, tt.wantExport)
			}
		})
	}

	// A damaged final checkpoint is an error, not "nothing pending".
	r := newTestRun(t)
	dir := writeCkpt(t, r, 10, map[string]string{"w": "weights"})
	if err := r.CommitCheckpoint(10); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, "w"))
	if _, _, _, err := r.PendingExport(); !errors.Is(err, ErrCorruptCheckpoint) {
		t.Errorf("damaged checkpoint: err = %v, want ErrCorruptCheckpoint", err)
	}
}
