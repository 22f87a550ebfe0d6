package jobs

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeClock is a settable clock for tests.
type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time          { return c.t }
func (c *fakeClock) Advance(d time.Duration) { c.t = c.t.Add(d) }
func fixedID(s string) func() uuid.UUID      { return func() uuid.UUID { return uuid.MustParse(s) } }
func at(t time.Time) func() time.Time        { return func() time.Time { return t } }

// mustCreate creates a run with a fixed time and id and closes its lock at
// the end of the test.
func mustCreate(t *testing.T, root string, when time.Time, id string, m Meta) *Run {
	t.Helper()
	r, err := create(root, m, at(when), fixedID(id))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestCreateLayout(t *testing.T) {
	root := filepath.Join(t.TempDir(), "runs")
	id := "0123abcd-0000-4000-8000-000000000001"
	specDir := t.TempDir()
	r := mustCreate(t, root, t0, id, Meta{Name: "grpo", SpecPath: "job.yaml", SpecDir: specDir, Seed: -42, TotalSteps: 10,
		Version: "v0.1.0", Host: "h1", Status: StatusFailed, LastStep: 3, Exported: "/x", ExportedStep: 3, Resumes: 2})
	if want := filepath.Join(root, "20260301-120000-0123abcd"); r.Dir() != want {
		t.Fatalf("dir = %q, want %q", r.Dir(), want)
	}
	for _, name := range []string{MetaFile, CheckpointsDir} {
		if _, err := os.Stat(filepath.Join(r.Dir(), name)); err != nil {
			t.Errorf("missing %s: %v", name, err)
		}
	}
	data, err := os.ReadFile(filepath.Join(r.Dir(), MetaFile))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"id": id, "name": "grpo", "spec_path": "job.yaml", "status": "running",
		"last_step": 0.0, "total_steps": 10.0, "host": "h1", "version": "v0.1.0",
		"created": "2026-03-01T12:00:00Z", "updated": "2026-03-01T12:00:00Z",
		"spec_dir": specDir, "seed": -42.0,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("run.json %s = %v, want %v", k, got[k], v)
		}
	}
	for _, k := range []string{"finished", "exported", "exported_step", "resumes", "error"} {
		if _, ok := got[k]; ok {
			t.Errorf("run.json of a new run has %s", k)
		}
	}
	if got["pid"] != float64(os.Getpid()) {
		t.Errorf("pid = %v", got["pid"])
	}
}

func TestCreateSpecDir(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		specDir string
		want    string
	}{
		{"", ""},
		{"/data/jobs", "/data/jobs"},
		{"/data/jobs/../specs/", "/data/specs"},
		{"examples", filepath.Join(wd, "examples")},
		{".", wd},
	}
	for _, tt := range tests {
		root := t.TempDir()
		r := mustCreate(t, root, t0, "12345678-0000-4000-8000-000000000001", Meta{SpecDir: tt.specDir, Seed: 7})
		o, err := Open(root, r.ID())
		if err != nil {
			t.Fatal(err)
		}
		if r.Meta().SpecDir != tt.want || o.Meta().SpecDir != tt.want || o.Meta().Seed != 7 {
			t.Errorf("spec dir %q: got %q, stored %q (seed %d), want %q",
				tt.specDir, r.Meta().SpecDir, o.Meta().SpecDir, o.Meta().Seed, tt.want)
		}
	}
}

func TestCreateRealAndCollision(t *testing.T) {
	root := t.TempDir()
	r, err := Create(root, Meta{Name: "x"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := uuid.Parse(r.ID()); err != nil {
		t.Fatalf("id %q: %v", r.ID(), err)
	}
	if r.Meta().Host == "" {
		t.Errorf("host not filled in")
	}
	// Same second, same first id: Create must pick another id.
	ids := []string{
		"aaaaaaaa-0000-4000-8000-000000000001",
		"aaaaaaaa-0000-4000-8000-000000000002",
		"bbbbbbbb-0000-4000-8000-000000000003",
	}
	next := 0
	gen := func() uuid.UUID { id := uuid.MustParse(ids[next]); next++; return id }
	a, err := create(root, Meta{}, at(t0), gen)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := create(root, Meta{}, at(t0), gen)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.ID() != ids[2] || a.Dir() == b.Dir() {
		t.Fatalf("collision not resolved: %s %s", a.Dir(), b.Dir())
	}
}

func TestOpen(t *testing.T) {
	root := t.TempDir()
	ids := []string{
		"abcd1234-0000-4000-8000-000000000001",
		"abcd5678-0000-4000-8000-000000000002",
		"ffff0000-0000-4000-8000-000000000003",
	}
	var dirs []string
	for i, id := range ids {
		r := mustCreate(t, root, t0.Add(time.Duration(i)*time.Hour), id, Meta{})
		dirs = append(dirs, filepath.Base(r.Dir()))
	}
	tests := []struct {
		query   string
		wantID  string
		wantErr error
		cands   int
	}{
		{query: ids[0], wantID: ids[0]},
		{query: strings.ToUpper(ids[1]), wantID: ids[1]},
		{query: "abcd1234", wantID: ids[0]},
		{query: "ffff", wantID: ids[2]},
		{query: dirs[1], wantID: ids[1]},
		{query: dirs[1] + "/", wantID: ids[1]},
		{query: "20260301-14", wantID: ids[2]},
		{query: "abcd", wantErr: ErrAmbiguous, cands: 2},
		{query: "2026", wantErr: ErrAmbiguous, cands: 3},
		{query: "0000", wantErr: ErrNotFound},
		{query: "", wantErr: ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			r, err := Open(root, tt.query)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				var amb *AmbiguousError
				if errors.As(err, &amb) {
					if len(amb.Candidates) != tt.cands {
						t.Errorf("candidates = %v", amb.Candidates)
					}
					for _, c := range amb.Candidates {
						if !strings.Contains(err.Error(), c) {
							t.Errorf("error %q does not list %s", err, c)
						}
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.ID() != tt.wantID || r.Meta().Dir != r.Dir() {
				t.Fatalf("opened %s (%s), want %s", r.ID(), r.Dir(), tt.wantID)
			}
		})
	}
	if _, err := Open(filepath.Join(root, "missing"), "abcd"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing root: %v", err)
	}
}

func TestList(t *testing.T) {
	root := t.TempDir()
	if ms, err := List(filepath.Join(root, "none")); ms != nil || err != nil {
		t.Fatalf("missing root: %v %v", ms, err)
	}
	ids := []string{
		"11111111-0000-4000-8000-000000000001",
		"22222222-0000-4000-8000-000000000002",
		"33333333-0000-4000-8000-000000000003",
	}
	// Created out of order: the list sorts by creation time.
	offsets := []time.Duration{2 * time.Hour, 0, time.Hour}
	for i, id := range ids {
		mustCreate(t, root, t0.Add(offsets[i]), id, Meta{Name: "run" + id[:1]})
	}
	// Broken entries: bad JSON, no run.json, bad status; ignored: hidden
	// directory and a plain file.
	for name, content := range map[string]string{
		"20260101-000000-deadbeef": "{not json",
		"junk":                     "",
		"20260101-000000-00000000": `{"id":"` + ids[0] + `","status":"weird"}`,
	} {
		dir := filepath.Join(root, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if content != "" {
			if err := os.WriteFile(filepath.Join(dir, MetaFile), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	os.Mkdir(filepath.Join(root, ".tmp"), 0o755)
	os.WriteFile(filepath.Join(root, "notes.txt"), nil, 0o644)

	ms, err := List(root)
	var got []string
	for _, m := range ms {
		got = append(got, m.ID)
	}
	want := []string{ids[0], ids[2], ids[1]}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("order = %v, want %v", got, want)
	}
	if ms[0].Name != "run1" || ms[0].Dir == "" {
		t.Errorf("meta = %+v", ms[0])
	}
	if err == nil {
		t.Fatal("broken runs not reported")
	}
	var broken []*BrokenRunError
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var b *BrokenRunError
		if !errors.As(e, &b) {
			t.Fatalf("unexpected error %v", e)
		}
		broken = append(broken, b)
	}
	if len(broken) != 3 {
		t.Fatalf("broken = %v", err)
	}
	if !errors.Is(err, ErrBadStatus) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("causes not wrapped: %v", err)
	}
}

func TestWriteFile(t *testing.T) {
	r := mustCreate(t, t.TempDir(), t0, "12345678-0000-4000-8000-000000000001", Meta{})
	if err := r.WriteSpec([]byte("name: x\n")); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteSpec([]byte("name: y\n")); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.ReadFile(SpecFile); string(got) != "name: y\n" {
		t.Errorf("spec = %q", got)
	}
	if err := r.WritePlan(map[string]int{"peak": 3}); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.ReadFile(PlanFile); string(got) != "{\n  \"peak\": 3\n}\n" {
		t.Errorf("plan = %q", got)
	}
	if err := r.WriteResolved([]byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.ReadFile(ResolvedFile); string(got) != `{"a":1}` {
		t.Errorf("resolved = %q", got)
	}
	tests := []struct {
		name    string
		write   func() error
		wantErr error
	}{
		{"bad json bytes", func() error { return r.WriteResolved([]byte("{")) }, nil},
		{"unencodable", func() error { return r.WritePlan(func() {}) }, nil},
		{"run.json", func() error { return r.WriteFile(MetaFile, nil) }, ErrReservedName},
		{"metrics", func() error { return r.WriteFile(MetricsFile, nil) }, ErrReservedName},
		{"dropped metrics", func() error { return r.WriteFile(DroppedMetricsFile, nil) }, ErrReservedName},
		{"updates", func() error { return r.WriteFile(UpdatesFile, nil) }, ErrReservedName},
		{"dropped updates", func() error { return r.WriteFile(DroppedUpdatesFile, nil) }, ErrReservedName},
		{"log", func() error { return r.WriteFile(LogFileName, nil) }, ErrReservedName},
		{"checkpoints", func() error { return r.WriteFile(CheckpointsDir, nil) }, ErrReservedName},
		{"hidden", func() error { return r.WriteFile(".lock", nil) }, ErrReservedName},
		{"subdir", func() error { return r.WriteFile("a/b", nil) }, nil},
		{"parent", func() error { return r.WriteFile("..", nil) }, nil},
		{"empty", func() error { return r.WriteFile("", nil) }, nil},
	}
	for _, tt := range tests {
		err := tt.write()
		if err == nil {
			t.Errorf("%s: no error", tt.name)
		} else if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
			t.Errorf("%s: err = %v, want %v", tt.name, err, tt.wantErr)
		}
	}
	entries, _ := os.ReadDir(r.Dir())
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
	if got, _ := r.ReadFile(ResolvedFile); string(got) != `{"a":1}` {
		t.Errorf("failed write changed resolved.json: %q", got)
	}
}

func TestWriteFileAtomicFailureKeepsOld(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := writeFileAtomic(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A directory where the file should be makes the rename fail.
	bad := filepath.Join(dir, "d")
	os.Mkdir(bad, 0o755)
	os.WriteFile(filepath.Join(bad, "x"), nil, 0o644)
	if err := writeFileAtomic(bad, []byte("new"), 0o644); err == nil {
		t.Fatal("rename over a non-empty directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("leftovers: %v", entries)
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Errorf("old file = %q", got)
	}
}

func TestSetStatus(t *testing.T) {
	root := t.TempDir()
	clk := &fakeClock{t: t0}
	r, err := create(root, Meta{}, clk.Now, fixedID("12345678-0000-4000-8000-000000000001"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	tests := []struct {
		status   Status
		err      error
		wantMsg  string
		finished bool
	}{
		{StatusFailed, errors.New("cuda oom"), "cuda oom", true},
		{StatusRunning, nil, "", false},
		{StatusCanceled, errors.New("interrupt"), "interrupt", true},
		{StatusSucceeded, nil, "", true},
	}
	for _, tt := range tests {
		clk.Advance(time.Minute)
		if err := r.SetStatus(tt.status, tt.err); err != nil {
			t.Fatal(err)
		}
		o, err := Open(root, "12345678")
		if err != nil {
			t.Fatal(err)
		}
		m := o.Meta()
		if m.Status != tt.status || m.Error != tt.wantMsg || !m.Updated.Equal(clk.t) ||
			m.Finished.IsZero() == tt.finished {
			t.Errorf("%s: meta = %+v", tt.status, m)
		}
	}
	if err := r.SetStatus("paused", nil); !errors.Is(err, ErrBadStatus) {
		t.Errorf("bad status: %v", err)
	}
	if err := r.SetTotalSteps(20); err != nil || r.Meta().TotalSteps != 20 {
		t.Errorf("total steps: %v", err)
	}
	if err := r.SetVersion("v2"); err != nil || r.Meta().Version != "v2" {
		t.Errorf("version: %v", err)
	}
}

func TestSetExported(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	r := mustCreate(t, root, t0, "12345678-0000-4000-8000-000000000001", Meta{TotalSteps: 4})
	tests := []struct {
		lastStep int // metrics lines written before
		dir      string
		want     string
		wantStep int
	}{
		{2, filepath.Join(r.Dir(), "export", "actor"), filepath.Join(r.Dir(), "export", "actor"), 2},
		{4, "out/actor", filepath.Join(wd, "out", "actor"), 4},
		{4, "", "", 0},
	}
	for _, tt := range tests {
		for r.Meta().LastStep < tt.lastStep {
			if err := r.AppendMetrics(Metrics{Step: r.Meta().LastStep + 1}); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.SetExported(tt.dir); err != nil {
			t.Fatal(err)
		}
		o, err := Open(root, r.ID())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []Meta{r.Meta(), o.Meta()} {
			if m.Exported != tt.want || m.ExportedStep != tt.wantStep {
				t.Errorf("SetExported(%q) at step %d: exported %q at step %d, want %q at step %d",
					tt.dir, tt.lastStep, m.Exported, m.ExportedStep, tt.want, tt.wantStep)
			}
		}
	}
}

func TestLogFile(t *testing.T) {
	r := mustCreate(t, t.TempDir(), t0, "12345678-0000-4000-8000-000000000001", Meta{})
	for _, s := range []string{"one\n", "two\n"} {
		w, err := r.LogFile()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := r.ReadFile(LogFileName); string(got) != "one\ntwo\n" {
		t.Errorf("log = %q", got)
	}
}
