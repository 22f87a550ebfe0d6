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

	bad := []struct {
		name string
		m    Metrics
	}{
		{"reserved extra", Metrics{Step: 1, Extra: map[string]float64{"loss": 1}}},
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
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newTestRun(t)
			path := filepath.Join(r.Dir(), MetricsFile)
			if err := os.WriteFile(path, []byte(tt.content), 0o644); err != nil {
				t.Fatal(err)
			}
			ms, err := r.Metrics()
			var steps []int
			for _, m := range ms {
				steps = append(steps, m.Step)
			}
			switch {
			case tt.wantErr:
				if err == nil || errors.Is(err, ErrTruncatedMetrics) || ms != nil {
					t.Fatalf("err = %v, metrics = %v; want hard error", err, ms)
				}
				if err := r.TruncateMetricsAfter(5); err == nil {
					t.Error("truncate rewrote a damaged file")
				}
				return
			case tt.wantWarn:
				if !errors.Is(err, ErrTruncatedMetrics) {
					t.Fatalf("err = %v, want truncation warning", err)
				}
			case err != nil:
				t.Fatalf("err = %v", err)
			}
			if !reflect.DeepEqual(steps, tt.wantSteps) {
				t.Fatalf("steps = %v, want %v", steps, tt.wantSteps)
			}
			// The next append must first repair the tail.
			if err := r.AppendMetrics(Metrics{Step: 7, Time: t0}); err != nil {
				t.Fatal(err)
			}
			data, _ := os.ReadFile(path)
			want := tt.afterFix + `{"step":7,"time":"2026-03-01T12:00:00Z","wall_s":0,"loss":0,"pg_loss":0,"kl":0,` +
				`"entropy":0,"clipfrac":0,"grad_norm":0,"lr":0,"tokens":0,"tokens_per_s":0,"peak_mem_bytes":0}` + "\n"
			if string(data) != want {
				t.Fatalf("file after append:\n%q\nwant\n%q", data, want)
			}
			if _, err := r.Metrics(); err != nil {
				t.Fatalf("after repair: %v", err)
			}
		})
	}
}

func TestTruncateMetricsAfter(t *testing.T) {
	tests := []struct {
		name     string
		content  string
		after    int
		want     string
		dropped  string
		lastStep int
	}{
		{"keep some", line1 + line2 + `{"step":3}` + "\n", 1, line1, line2 + `{"step":3}` + "\n", 1},
		{"keep all", line1 + line2, 5, line1 + line2, "", 2},
		{"drop all", line1 + line2, 0, "", line1 + line2, 0},
		{"partial tail", line1 + line2 + `{"step":3,`, 2, line1 + line2, "", 2},
		{"complete tail without newline", line1 + `{"step":2}`, 2, line1 + `{"step":2}` + "\n", "", 2},
		{"no file", "", 3, "", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newTestRun(t)
			path := filepath.Join(r.Dir(), MetricsFile)
			if tt.content != "" {
				if err := os.WriteFile(path, []byte(tt.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			r.meta.LastStep = 99
			if err := r.TruncateMetricsAfter(tt.after); err != nil {
				t.Fatal(err)
			}
			data, _ := os.ReadFile(path)
			if string(data) != tt.want {
				t.Errorf("metrics = %q, want %q", data, tt.want)
			}
			dropped, _ := os.ReadFile(filepath.Join(r.Dir(), DroppedMetricsFile))
			if string(dropped) != tt.dropped {
				t.Errorf("dropped = %q, want %q", dropped, tt.dropped)
			}
			o, err := Open(filepath.Dir(r.Dir()), r.ID())
			if err != nil {
				t.Fatal(err)
			}
			if r.Meta().LastStep != tt.lastStep || o.Meta().LastStep != tt.lastStep {
				t.Errorf("last step = %d (stored %d), want %d", r.Meta().LastStep, o.Meta().LastStep, tt.lastStep)
			}
		})
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
				if err := r.AppendMetrics(Metrics{Step: g*5 + i + 1}); err != nil {
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
}
