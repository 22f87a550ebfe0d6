package reward

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// testSamples returns n crafted samples: sample i has index 100+i, group
// i/2, i%3+1 prompt tokens, i%5 response tokens (ids 10*i+j), finish "stop"
// for even i, and a "bonus" label of i.
func testSamples(n int) []Sample {
	samples := make([]Sample, n)
	for i := range samples {
		s := Sample{Index: 100 + i, Group: i / 2, Finish: "length", Labels: map[string]any{"bonus": float64(i)}}
		for j := range i%3 + 1 {
			s.Prompt = append(s.Prompt, int32(j+1))
		}
		for j := range i % 5 {
			s.Response = append(s.Response, int32(10*i+j))
		}
		if i%2 == 0 {
			s.Finish = "stop"
		}
		samples[i] = s
	}
	return samples
}

// wantFields returns what the "fields" helper answers for samples.
func wantFields(samples []Sample) []float64 {
	want := make([]float64, len(samples))
	for i, s := range samples {
		w := wireSample{Index: s.Index, Group: s.Group, PromptTokens: s.Prompt, ResponseTokens: s.Response, Finish: s.Finish, Label: s.Labels}
		want[i] = fieldsReward(w)
	}
	return want
}

// newCommand builds the scorer of argv with New, failing the test on error.
func newCommand(t *testing.T, argv []string, timeoutS float64) *commandScorer {
	t.Helper()
	s, err := New(Config{Command: argv, TimeoutS: timeoutS})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c, ok := s.(*commandScorer)
	if !ok {
		t.Fatalf("New returned %T, want *commandScorer", s)
	}
	return c
}

func TestCommandScore(t *testing.T) {
	big := testSamples(400)
	for i := range big {
		big[i].Response = make([]int32, 2000) // 400 lines of ~4 KB: far more than a pipe holds
		big[i].Response[0] = int32(i)
	}
	tests := []struct {
		name    string
		argv    []string
		samples []Sample
		want    []float64
	}{
		{"fields as objects", helperCommand("fields"), testSamples(7), wantFields(testSamples(7))},
		{"plain numbers", helperCommand("number"), testSamples(6), []float64{0, 1, 2, 3, 4, 0}},
		{"one sample", helperCommand("number"), testSamples(5)[4:], []float64{4}},
		{"large batch answered while read", helperCommand("fields"), big, wantFields(big)},
		{"answer before reading a large batch", helperCommand("noread", "400"), big, repeat(2, 400)},
		{"empty batch starts nothing", helperCommand("fail"), nil, []float64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCommand(t, tt.argv, 60)
			got, err := c.Score(context.Background(), tt.samples)
			if err != nil {
				t.Fatalf("Score: %v", err)
			}
			if !equalFloats(got, tt.want) {
				t.Fatalf("Score = %v, want %v", head(got), head(tt.want))
			}
		})
	}
}

func TestCommandErrors(t *testing.T) {
	tests := []struct {
		name  string
		mode  string
		want  []string // substrings of the error
		check func(error) bool
	}{
		{
			name:  "non-zero exit with stderr",
			mode:  "fail",
			want:  []string{"reward command", "fail", "exit status 3", "stderr: scorer: something broke"},
			check: func(err error) bool { var ee *exec.ExitError; return errors.As(err, &ee) && ee.ExitCode() == 3 },
		},
		{
			name: "too few lines",
			mode: "short",
			want: []string{"got 2 lines for 3 samples"},
			check: func(err error) bool {
				var ce *CountError
				return errors.As(err, &ce) && ce.Lines == 2 && ce.Samples == 3
			},
		},
		{
			name:  "too many lines",
			mode:  "long",
			want:  []string{"got 4 lines for 3 samples"},
			check: func(err error) bool { var ce *CountError; return errors.As(err, &ce) && ce.Lines == 4 },
		},
		{
			name:  "non-numeric reward",
			mode:  "bad",
			want:  []string{"stdout line 2:", `"\"high\"" is not a number`},
			check: func(err error) bool { var le *LineError; return errors.As(err, &le) && le.Line == 2 },
		},
		{
			name:  "non-finite reward",
			mode:  "nan",
			want:  []string{"stdout line 1:", "non-finite"},
			check: func(err error) bool { var le *LineError; return errors.As(err, &le) && le.Line == 1 },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCommand(t, helperCommand(tt.mode), 60)
			_, err := c.Score(context.Background(), testSamples(3))
			if err == nil {
				t.Fatal("Score succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if !tt.check(err) {
				t.Errorf("error %q (%T) is not the error wanted", err, err)
			}
		})
	}
}

func TestCommandTimeoutAndCancel(t *testing.T) {
	tests := []struct {
		name     string
		timeoutS float64
		cancel   time.Duration // cancel the context after this long; 0: never
		is       error
		want     []string
	}{
		{"timeout", 0.3, 0, context.DeadlineExceeded, []string{"timed out after 300ms", "stderr: scorer: sleeping"}},
		{"cancel", 60, 300 * time.Millisecond, context.Canceled, []string{"context canceled"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCommand(t, helperCommand("sleep"), tt.timeoutS)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.cancel > 0 {
				time.AfterFunc(tt.cancel, cancel)
			}
			start := time.Now()
			_, err := c.Score(ctx, testSamples(2))
			if elapsed := time.Since(start); elapsed > 10*time.Second {
				t.Errorf("Score took %v: the sleeping scorer was not killed", elapsed)
			}
			if !errors.Is(err, tt.is) {
				t.Fatalf("error %v, want one wrapping %v", err, tt.is)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// repeat returns n copies of v.
func repeat(v float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// equalFloats reports whether a and b hold exactly the same values.
func equalFloats(a, b []float64) bool {
	if len(a) != len(b) || (a == nil) != (b == nil) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// head formats the start of a long slice for a failure message.
func head(v []float64) string {
	if len(v) <= 10 {
		return fmt.Sprint(v)
	}
	return fmt.Sprintf("%v... (%d values)", v[:10], len(v))
}
