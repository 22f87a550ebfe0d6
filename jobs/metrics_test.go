package jobs

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func newTestRun(t *testing.T) *Run {
	t.Helper()
	return mustCreate(t, t.TempDir(), t0, "12345678-0000-4000-8000-000000000001", Meta{TotalSteps: 10})
}

func TestMetricsJSON(t *testing.T) {
	m := Metrics{
		Step: 3, Time: t0, WallS: 1.5, Loss: 0.25, PGLoss: -0.125, KL: 1e-5,
		Entropy: 2, ClipFrac: 0.5, GradNorm: math.NaN(), LR: 3e-6, Tokens: 16384,
		TokensPerS: math.Inf(1), PeakMemBytes: 1 << 34,
		Extra: map[string]float64{"reward": 0.75, "a.b": math.Inf(-1)},
	}
	b, err := m.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"step":3,"time":"2026-03-01T12:00:00Z","wall_s":1.5,"loss":0.25,"pg_loss":-0.125,` +
		`"kl":1e-05,"entropy":2,"clipfrac":0.5,"grad_norm":"NaN","lr":3e-06,"tokens":16384,` +
		`"tokens_per_s":"+Inf","peak_mem_bytes":17179869184,"a.b":"-Inf","reward":0.75}`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
	var back Metrics
	if err := back.UnmarshalJSON(b); err != nil {
		t.Fatal(err)
	}
	if !math.IsNaN(back.GradNorm) {
		t.Errorf("grad_norm = %v", back.GradNorm)
	}
	back.GradNorm, m.GradNorm = 0, 0
	if !reflect.DeepEqual(back, m) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, m)
	}

	counts := []struct {
		name string
		m    Metrics
		want string
	}{
		{"step summary", Metrics{Step: 4, Updates: 8, Loss: 1},
			`{"step":4,"updates":8,"wall_s":0,"loss":1,`},
		{"update", Metrics{Step: 4, Update: 27, Epoch: 2, MiniBatch: 3, Time: t0},
			`{"step":4,"update":27,"epoch":2,"mini_batch":3,"time":"2026-03-01T12:00:00Z","wall_s":0,`},
		{"zero counts omitted", Metrics{Step: 1}, `{"step":1,"wall_s":0,`},
	}
	for _, tt := range counts {
		b, err := tt.m.MarshalJSON()
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if !strings.HasPrefix(string(b), tt.want) {
			t.Errorf("%s: got %s\nwant prefix %s", tt.name, b, tt.want)
		}
		var back Metrics
		if err := back.UnmarshalJSON(b); err != nil || !reflect.DeepEqual(back, tt.m) {
			t.Errorf("%s: round trip %+v, %v", tt.name, back, err)
		}
	}

	bad := []struct {
		name string
		m    Metrics
	}{
		{"reserved extra", Metrics{Step: 1, Extra: map[string]float64{"loss": 1}}},
		{"reserved count as extra", Metrics{Step: 1, Extra: map[string]float64{"epoch": 1}}},
		{"reserved update as extra", Metrics{Step: 1, Extra: map[string]float64{"update": 1}}},
		{"empty extra", Metrics{Step: 1, Extra: map[string]float64{"": 1}}},
	}
	for _, tt := range bad {
		if _, err := tt.m.MarshalJSON(); err == nil {
			t.Errorf("%s: no error", tt.name)
		}
	}
	decode := []struct {
		line    string
		wantErr bool
		want    Metrics
	}{
		{`{"step":2,"phase":"train","x":1}`, false, Metrics{Step: 2, Extra: map[string]float64{"x": 1}}},
		{`{"loss":1}`, true, Metrics{}},
		{`{"step":"2"}`, true, Metrics{}},
		{`{"step":2,"loss":"high"}`, true, Metrics{}},
		{`{"step":2,"update":5,"epoch":1,"mini_batch":2,"updates":0}`, false, Metrics{Step: 2, Update: 5, Epoch: 1, MiniBatch: 2}},
		{`{"step":2,"update":1.5}`, true, Metrics{}},
		{`{"step":2,"epoch":"1"}`, true, Metrics{}},
		{`[1]`, true, Metrics{}},
		{`null`, true, Metrics{}},
	}
	for _, tt := range decode {
		var got Metrics
		err := got.UnmarshalJSON([]byte(tt.line))
		if (err != nil) != tt.wantErr {
			t.Errorf("%s: err = %v", tt.line, err)
			continue
		}
		if err == nil && !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: got %+v", tt.line, got)
		}
	}
}

func TestAppendMetricsRoundTrip(t *testing.T) {
	r := newTestRun(t)
	var want []Metrics
	for step := 1; step <= 4; step++ {
		m := Metrics{Step: step, Time: t0.Add(time.Duration(step) * time.Second), Loss: 1 / float64(step),
			Tokens: int64(step * 100), Extra: map[string]float64{"reward": float64(step)}}
		if err := r.AppendMetrics(m); err != nil {
			t.Fatal(err)
		}
		want = append(want, m)
	}
	got, err := r.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if r.Meta().LastStep != 4 {
		t.Errorf("last step = %d", r.Meta().LastStep)
	}
	o, err := Open(filepath.Dir(r.Dir()), r.ID())
	if err != nil {
		t.Fatal(err)
	}
	if o.Meta().LastStep != 4 {
		t.Errorf("stored last step = %d", o.Meta().LastStep)
	}
	if err := r.AppendMetrics(Metrics{Step: 0}); err == nil {
		t.Error("step 0 accepted")
	}
	if err := r.AppendMetrics(Metrics{Step: 5, Extra: map[string]float64{"kl": 1}}); err == nil {
		t.Error("reserved extra key accepted")
	}
	// No time given: the run's clock fills it in.
	if err := r.AppendMetrics(Metrics{Step: 5}); err != nil {
		t.Fatal(err)
	}
	got, _ = r.Metrics()
	if !got[4].Time.Equal(t0) {
		t.Errorf("time = %v", got[4].Time)
	}
}

const (
	line1 = `{"step":1,"loss":0.5}` + "\n"
	line2 = `{"step":2,"loss":0.25}` + "\n"
)

// jsonlKind is one of the JSONL metric files with its reader and writer.
type jsonlKind struct {
	file   string
	read   func(r *Run) ([]Metrics, error)
	append func(r *Run, m Metrics) error
	fields string // what append writes between step and time
}

var jsonlKinds = []jsonlKind{
	{MetricsFile, (*Run).Metrics, (*Run).AppendMetrics, ""},
	{UpdatesFile, (*Run).Updates, func(r *Run, m Metrics) error {
		m.Update = 9
		return r.AppendUpdate(m)
	}, `"update":9,`},
}

// TestMetricsTruncatedTail checks reading, and repairing before the next
// append, of metrics.jsonl and updates.jsonl after a crash.
func TestMetricsTruncatedTail(t *testing.T) {
	tests := []struct {
		name      string
		content   string
		wantSteps []int
		wantWarn  bool // ErrTruncatedMetrics
		wantErr   bool // any other error
		afterFix  string
	}{
		{name: "clean", content: line1 + line2, wantSteps: []int{1, 2}, afterFix: line1 + line2},
		{name: "empty", content: "", wantSteps: nil, afterFix: ""},
		{name: "cut in value", content: line1 + line2 + `{"step":3,"lo`, wantSteps: []int{1, 2}, wantWarn: true, afterFix: line1 + line2},
		{name: "cut in number", content: line1 + `{"step":1`, wantSteps: []int{1}, wantWarn: true, afterFix: line1},
		{name: "zero filled", content: line1 + "\x00\x00\x00\x00", wantSteps: []int{1}, wantWarn: true, afterFix: line1},
		{name: "only partial", content: `{"st`, wantSteps: nil, wantWarn: true, afterFix: ""},
		{name: "complete without newline", content: line1 + strings.TrimSuffix(line2, "\n"), wantSteps: []int{1, 2}, afterFix: line1 + line2},
		{name: "blank lines", content: line1 + "\n  \n" + line2, wantSteps: []int{1, 2}, afterFix: line1 + "\n  \n" + line2},
		{name: "damaged middle", content: line1 + "{\"step\":2,\n" + line2, wantErr: true},
		{name: "damaged middle with tail", content: "garbage\n" + line1 + `{"st`, wantErr: true},
	}
	for _, kind := range jsonlKinds {
		for _, tt := range tests {
			t.Run(kind.file+"/"+tt.name, func(t *testing.T) {
				r := newTestRun(t)
				path := filepath.Join(r.Dir(), kind.file)
				if err := os.WriteFile(path, []byte(tt.content), 0o644); err != nil {
					t.Fatal(err)
				}
				ms, err := kind.read(r)
				var steps []int
				for _, m := range ms {
					steps = append(steps, m.Step)
				}
				switch {
				case tt.wantErr:
					if err == nil || errors.Is(err, ErrTruncatedMetrics) || ms != nil {
						t.Fatalf("err = %v, metrics = %v; want hard error", err, ms)
					}
					if !strings.Contains(err.Error(), kind.file) {
						t.Errorf("error %q does not name %s", err, kind.file)
					}
					if err := r.TruncateMetricsAfter(5); err == nil {
						t.Error("truncate rewrote a damaged file")
					}
					return
				case tt.wantWarn:
					if !errors.Is(err, ErrTruncatedMetrics) || !strings.Contains(err.Error(), kind.file) {
						t.Fatalf("err = %v, want a truncation warning naming %s", err, kind.file)
					}
				case err != nil:
					t.Fatalf("err = %v", err)
				}
				if !reflect.DeepEqual(steps, tt.wantSteps) {
					t.Fatalf("steps = %v, want %v", steps, tt.wantSteps)
				}
				// The next append must first repair the tail.
				if err := kind.append(r, Metrics{Step: 7, Time: t0}); err != nil {
					t.Fatal(err)
				}
				data, _ := os.ReadFile(path)
				want := tt.afterFix + `{"step":7,` + kind.fields + `"time":"2026-03-01T12:00:00Z","wall_s":0,"loss":0,"pg_loss":0,"kl":0,` +
					`"entropy":0,"clipfrac":0,"grad_norm":0,"lr":0,"tokens":0,"tokens_per_s":0,"peak_mem_bytes":0}` + "\n"
				if string(data) != want {
					t.Fatalf("file after append:\n%q\nwant\n%q", data, want)
				}
				if _, err := kind.read(r); err != nil {
					t.Fatalf("after repair: %v", err)
				}
			})
		}
	}
}

// Update lines for the truncation tests: two of step 1, one of step 2.
const (
	upd11 = `{"step":1,"update":1,"epoch":1,"mini_batch":1}` + "\n"
	upd12 = `{"step":1,"update":2,"epoch":1,"mini_batch":2}` + "\n"
	upd21 = `{"step":2,"update":3,"epoch":1,"mini_batch":1}` + "\n"
)

func TestTruncateMetricsAfter(t *testing.T) {
	tests := []struct {
		name           string
		content        string // metrics.jsonl; "" for none
		updates        string // updates.jsonl; "" for none
		after          int
		want           string
		dropped        string
		wantUpdates    string
		droppedUpdates string
		lastStep       int
		wantErr        bool
	}{
		{name: "keep some", content: line1 + line2 + `{"step":3}` + "\n", updates: upd11 + upd12 + upd21, after: 1,
			want: line1, dropped: line2 + `{"step":3}` + "\n", wantUpdates: upd11 + upd12, droppedUpdates: upd21, lastStep: 1},
		{name: "keep all", content: line1 + line2, updates: upd11 + upd12 + upd21, after: 5,
			want: line1 + line2, wantUpdates: upd11 + upd12 + upd21, lastStep: 2},
		{name: "drop all", content: line1 + line2, updates: upd11 + upd21, after: 0,
			dropped: line1 + line2, droppedUpdates: upd11 + upd21, lastStep: 0},
		{name: "updates of an unfinished step", content: line1, updates: upd11 + upd12 + upd21, after: 1,
			want: line1, wantUpdates: upd11 + upd12, droppedUpdates: upd21, lastStep: 1},
		{name: "partial tail", content: line1 + line2 + `{"step":3,`, updates: upd11 + `{"step":2,"upd`, after: 2,
			want: line1 + line2, wantUpdates: upd11, lastStep: 2},
		{name: "complete tail without newline", content: line1 + `{"step":2}`, updates: strings.TrimSuffix(upd21, "\n"), after: 2,
			want: line1 + `{"step":2}` + "\n", wantUpdates: upd21, lastStep: 2},
		{name: "no updates file", content: line1 + line2, after: 1, want: line1, dropped: line2, lastStep: 1},
		{name: "no files", after: 3, lastStep: 0},
		{name: "damaged updates", content: line1 + line2, updates: "garbage\n" + upd21, after: 1,
			want: line1 + line2, wantUpdates: "garbage\n" + upd21, lastStep: 99, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newTestRun(t)
			for file, content := range map[string]string{MetricsFile: tt.content, UpdatesFile: tt.updates} {
				if content != "" {
					if err := os.WriteFile(filepath.Join(r.Dir(), file), []byte(content), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			r.meta.LastStep = 99
			if err := r.TruncateMetricsAfter(tt.after); (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			for _, f := range []struct{ name, want string }{
				{MetricsFile, tt.want}, {DroppedMetricsFile, tt.dropped},
				{UpdatesFile, tt.wantUpdates}, {DroppedUpdatesFile, tt.droppedUpdates},
			} {
				if data, _ := os.ReadFile(filepath.Join(r.Dir(), f.name)); string(data) != f.want {
					t.Errorf("%s = %q, want %q", f.name, data, f.want)
				}
			}
			if r.Meta().LastStep != tt.lastStep {
				t.Errorf("last step = %d, want %d", r.Meta().LastStep, tt.lastStep)
			}
			if tt.wantErr {
				return
			}
			o, err := Open(filepath.Dir(r.Dir()), r.ID())
			if err != nil {
				t.Fatal(err)
			}
			if o.Meta().LastStep != tt.lastStep {
				t.Errorf("stored last step = %d, want %d", o.Meta().LastStep, tt.lastStep)
			}
		})
	}
}

func TestAppendUpdate(t *testing.T) {
	tests := []struct {
		name    string
		m       Metrics
		wantErr bool
	}{
		{name: "first", m: Metrics{Step: 1, Update: 1, Epoch: 1, MiniBatch: 1, Loss: 0.5}},
		{name: "next", m: Metrics{Step: 1, Update: 2, Epoch: 1, MiniBatch: 2, GradNorm: math.NaN()}},
		{name: "no epoch or mini-batch", m: Metrics{Step: 2, Update: 3, Extra: map[string]float64{"ratio": 1.1}}},
		{name: "step 0", m: Metrics{Step: 0, Update: 4}, wantErr: true},
		{name: "no update index", m: Metrics{Step: 2}, wantErr: true},
		{name: "negative update", m: Metrics{Step: 2, Update: -1}, wantErr: true},
		{name: "negative epoch", m: Metrics{Step: 2, Update: 4, Epoch: -1}, wantErr: true},
		{name: "negative mini-batch", m: Metrics{Step: 2, Update: 4, MiniBatch: -2}, wantErr: true},
		{name: "reserved extra", m: Metrics{Step: 2, Update: 4, Extra: map[string]float64{"mini_batch": 1}}, wantErr: true},
	}
	r := newTestRun(t)
	var want []Metrics
	for _, tt := range tests {
		err := r.AppendUpdate(tt.m)
		if (err != nil) != tt.wantErr {
			t.Errorf("%s: err = %v, want error %v", tt.name, err, tt.wantErr)
		}
		if err == nil {
			m := tt.m
			m.Time = t0 // the run's clock
			want = append(want, m)
		}
	}
	got, err := r.Updates()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) || !math.IsNaN(got[1].GradNorm) {
		t.Fatalf("updates = %+v", got)
	}
	got[1].GradNorm, want[1].GradNorm = 0, 0
	if !reflect.DeepEqual(got, want) {
		t.Errorf("updates:\n got %+v\nwant %+v", got, want)
	}
	if r.Meta().LastStep != 0 {
		t.Errorf("updates changed last step to %d", r.Meta().LastStep)
	}
	if ms, err := r.Metrics(); ms != nil || err != nil {
		t.Errorf("updates went to metrics.jsonl: %v %v", ms, err)
	}

	// Step summary lines: Updates is kept, an update index is refused.
	steps := []struct {
		name    string
		m       Metrics
		wantErr bool
	}{
		{name: "summary", m: Metrics{Step: 1, Updates: 2}},
		{name: "summary without count", m: Metrics{Step: 2}},
		{name: "update index on a step line", m: Metrics{Step: 3, Update: 3}, wantErr: true},
		{name: "negative count", m: Metrics{Step: 3, Updates: -1}, wantErr: true},
	}
	for _, tt := range steps {
		if err := r.AppendMetrics(tt.m); (err != nil) != tt.wantErr {
			t.Errorf("%s: err = %v, want error %v", tt.name, err, tt.wantErr)
		}
	}
	ms, err := r.Metrics()
	if err != nil || len(ms) != 2 || ms[0].Updates != 2 || ms[1].Updates != 0 || r.Meta().LastStep != 2 {
		t.Errorf("metrics = %+v, %v, last step %d", ms, err, r.Meta().LastStep)
	}
	if got, err := r.Updates(); err != nil || len(got) != len(want) {
		t.Errorf("step lines went to updates.jsonl: %d lines, %v", len(got), err)
	}
}

func TestMetricsFields(t *testing.T) {
	m := Metrics{Loss: 1, TokensPerS: 2, Extra: map[string]float64{"z": 3, "a": 4}}
	var names []string
	for _, f := range m.Fields() {
		names = append(names, f.Name)
	}
	want := "loss tok/s pg_loss kl entropy clipfrac grad_norm lr a z"
	if strings.Join(names, " ") != want {
		t.Errorf("fields = %v", names)
	}
}

func TestAppendMetricsConcurrent(t *testing.T) {
	r := newTestRun(t)
	done := make(chan error)
	for g := range 4 {
		go func() {
			for i := range 5 {
				step := g*5 + i + 1
				if err := r.AppendUpdate(Metrics{Step: step, Update: step}); err != nil {
					done <- err
					return
				}
				if err := r.AppendMetrics(Metrics{Step: step, Updates: 1}); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	ms, err := r.Metrics()
	if err != nil || len(ms) != 20 || r.Meta().LastStep != 20 {
		t.Fatalf("%d metrics, last step %d, err %v", len(ms), r.Meta().LastStep, err)
	}
	us, err := r.Updates()
	if err != nil || len(us) != 20 {
		t.Fatalf("%d updates, err %v", len(us), err)
	}
}
