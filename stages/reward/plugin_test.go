package reward

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
)

// funcScorer adapts a function to Scorer.
type funcScorer func(ctx context.Context, samples []Sample) ([]float64, error)

func (f funcScorer) Score(ctx context.Context, samples []Sample) ([]float64, error) {
	return f(ctx, samples)
}

func init() {
	Register("test_length", funcScorer(func(_ context.Context, samples []Sample) ([]float64, error) {
		out := make([]float64, len(samples))
		for i, s := range samples {
			out[i] = float64(len(s.Response))
		}
		return out, nil
	}))
	Register("test_short", funcScorer(func(_ context.Context, samples []Sample) ([]float64, error) {
		return make([]float64, len(samples)-1), nil
	}))
	Register("test_nan", funcScorer(func(_ context.Context, samples []Sample) ([]float64, error) {
		out := make([]float64, len(samples))
		out[len(out)-1] = math.NaN()
		return out, nil
	}))
	Register("test_fail", funcScorer(func(context.Context, []Sample) ([]float64, error) {
		return nil, errors.New("verifier down")
	}))
}

func TestPluginScore(t *testing.T) {
	tests := []struct {
		name string
		want []float64
		err  string
	}{
		{"test_length", []float64{0, 1, 2}, ""},
		{"test_short", nil, `reward plugin "test_short": returned 2 rewards for 3 samples`},
		{"test_nan", nil, `reward plugin "test_nan": sample 102: non-finite reward NaN`},
		{"test_fail", nil, `reward plugin "test_fail": verifier down`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(Config{Plugin: tt.name})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			got, err := s.Score(context.Background(), testSamples(3))
			if tt.err != "" {
				if err == nil || err.Error() != tt.err {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Score: %v", err)
			}
			if !equalFloats(got, tt.want) {
				t.Fatalf("Score = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPluginUnknown(t *testing.T) {
	tests := []struct {
		name string
		want string
	}{
		{"test_lenght", `(did you mean "test_length"?)`},
		{"Test_Length", `(did you mean "test_length"?)`},
		{"math_verify", "(registered: test_fail, test_length, test_nan, test_short)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(Config{Plugin: tt.name})
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != "plugin" {
				t.Fatalf("error %v (%T), want a *ConfigError about plugin", err, err)
			}
			if !strings.Contains(err.Error(), `unknown reward plugin "`+tt.name+`"`) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want the name and %q", err, tt.want)
			}
		})
	}
}

func TestRegisterPanics(t *testing.T) {
	ok := funcScorer(func(context.Context, []Sample) ([]float64, error) { return nil, nil })
	tests := []struct {
		name  string
		reg   string
		s     Scorer
		panic string
	}{
		{"empty name", "", ok, "needs a name and a scorer"},
		{"nil scorer", "test_nil", nil, "needs a name and a scorer"},
		{"duplicate", "test_length", ok, `plugin "test_length" registered twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if s, _ := r.(string); !strings.Contains(s, tt.panic) {
					t.Fatalf("panic %v, want one containing %q", r, tt.panic)
				}
			}()
			Register(tt.reg, tt.s)
		})
	}
	if got := strings.Join(Plugins(), ","); got != "test_fail,test_length,test_nan,test_short" {
		t.Errorf("Plugins() = %s after the failed registrations", got)
	}
}

func TestClosest(t *testing.T) {
	names := []string{"response", "prompt", "finish", "label", "group"}
	tests := []struct{ in, want string }{
		{"respons", "response"},
		{"lable", "label"},
		{"grop", "group"},
		{"x", ""},
		{"completion", ""},
	}
	for _, tt := range tests {
		if got := closest(tt.in, names); got != tt.want {
			t.Errorf("closest(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
