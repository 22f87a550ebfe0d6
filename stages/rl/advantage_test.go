package rl

import (
	"math"
	"testing"
)

func TestAdvantages(t *testing.T) {
	s3 := math.Sqrt(1.0 / 3) // unbiased std of {1, 0, 1, 0}
	s2 := math.Sqrt(2)       // unbiased std of {1, 3}
	s8 := math.Sqrt(8)       // unbiased std of {2, 6}
	rpp := 1 / math.Sqrt(1.0/6+1e-8)
	tests := []struct {
		name    string
		rewards []float64
		groups  []int
		method  string
		norm    bool
		want    []float64
	}{
		{"grpo std", []float64{1, 0, 1, 0}, []int{0, 0, 0, 0}, "grpo", true,
			[]float64{0.5 / (s3 + 1e-6), -0.5 / (s3 + 1e-6), 0.5 / (s3 + 1e-6), -0.5 / (s3 + 1e-6)}},
		{"grpo no std", []float64{1, 0, 1, 0}, []int{0, 0, 0, 0}, "grpo", false, []float64{0.5, -0.5, 0.5, -0.5}},
		{"empty method is grpo", []float64{1, 0}, []int{7, 7}, "", false, []float64{0.5, -0.5}},
		{"interleaved groups", []float64{1, 2, 3, 6}, []int{0, 1, 0, 1}, "grpo", true,
			[]float64{-1 / (s2 + 1e-6), -2 / (s8 + 1e-6), 1 / (s2 + 1e-6), 2 / (s8 + 1e-6)}},
		{"group of one", []float64{5, 1, 3}, []int{0, 1, 1}, "grpo", true,
			[]float64{0, -1 / (s2 + 1e-6), 1 / (s2 + 1e-6)}},
		{"equal rewards", []float64{2, 2}, []int{0, 0}, "grpo", true, []float64{0, 0}},
		{"gspo equals grpo", []float64{1, 0, 1, 0}, []int{0, 0, 0, 0}, "gspo", true,
			[]float64{0.5 / (s3 + 1e-6), -0.5 / (s3 + 1e-6), 0.5 / (s3 + 1e-6), -0.5 / (s3 + 1e-6)}},
		{"reinforce++ whitened", []float64{1, 0, 0, 0}, []int{0, 0, 1, 1}, "reinforce++", true,
			[]float64{0.5 * rpp, -0.5 * rpp, 0, 0}},
		{"reinforce++ baseline only", []float64{1, 0, 3, 1}, []int{0, 0, 1, 1}, "reinforce++", false,
			[]float64{0.5, -0.5, 1, -1}},
		{"reinforce++ single sample", []float64{4}, []int{0}, "reinforce++", true, []float64{0}},
		{"empty", nil, nil, "grpo", true, []float64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Advantages(tt.rewards, tt.groups, tt.method, tt.norm)
			if err != nil {
				t.Fatal(err)
			}
			assertClose(t, "advantages", got, tt.want, 1e-9)
		})
	}
}

func TestAdvantagesErrors(t *testing.T) {
	tests := []struct {
		name    string
		rewards []float64
		groups  []int
		method  string
	}{
		{"length mismatch", []float64{1, 2}, []int{0}, "grpo"},
		{"nan reward", []float64{1, math.NaN()}, []int{0, 0}, "grpo"},
		{"inf reward", []float64{math.Inf(-1)}, []int{0}, "grpo"},
		{"negative group", []float64{1}, []int{-1}, "grpo"},
		{"unknown method", []float64{1}, []int{0}, "rloo"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Advantages(tt.rewards, tt.groups, tt.method, true); err == nil {
				t.Fatal("expected an error")
			}
		})
	}
}

func TestWhiten(t *testing.T) {
	// W = 4, μ = 2.5, σ² = (2.25 + 3·0.25)/4 · 4/3 = 1.
	got, err := Whiten([]float64{1, 3}, []float64{1, 3})
	if err != nil {
		t.Fatal(err)
	}
	inv := 1 / math.Sqrt(1+1e-8)
	assertClose(t, "weighted", got, []float64{-1.5 * inv, 0.5 * inv}, 1e-12)
	// Total weight below 2: no Bessel correction. W = 1, μ = 2, σ² = 1.
	got, err = Whiten([]float64{1, 3}, []float64{0.5, 0.5})
	if err != nil {
		t.Fatal(err)
	}
	assertClose(t, "no bessel", got, []float64{-1 * inv, 1 * inv}, 1e-12)
	for name, w := range map[string][]float64{
		"zero weight":     {0, 0},
		"negative weight": {1, -1},
		"short weights":   {1},
	} {
		if _, err := Whiten([]float64{1, 2}, w); err == nil {
			t.Errorf("%s: expected an error", name)
		}
	}
	if _, err := Whiten([]float64{math.NaN()}, nil); err == nil {
		t.Error("nan value: expected an error")
	}
}

func assertClose(t *testing.T, what string, got, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d values %v, want %d %v", what, len(got), got, len(want), want)
	}
	for i := range got {
		if math.Abs(got[i]-want[i]) > tol*math.Max(1, math.Abs(want[i])) {
			t.Fatalf("%s[%d] = %.12g, want %.12g (all %v)", what, i, got[i], want[i], got)
		}
	}
}
