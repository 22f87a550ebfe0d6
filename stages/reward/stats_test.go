package reward

import (
	"math"
	"testing"
)

func TestSummarize(t *testing.T) {
	tests := []struct {
		name    string
		rewards []float64
		groups  []int
		want    Stats
	}{
		{"empty", nil, nil, Stats{}},
		{"all equal", []float64{1, 1, 1, 1}, []int{0, 0, 1, 1}, Stats{Mean: 1, Std: 0, ZeroVarGroups: 1}},
		// mean 0.75; deviations 0.25, -0.75, 0.25, 0.25: variance 0.75/4.
		{"one group varies", []float64{1, 0, 1, 1}, []int{0, 0, 1, 1}, Stats{Mean: 0.75, Std: math.Sqrt(0.1875), ZeroVarGroups: 0.5}},
		{"single-sample groups have no variance", []float64{0, 2}, []int{7, 3}, Stats{Mean: 1, Std: 1, ZeroVarGroups: 1}},
		// Groups interleaved: group 0 is {1, 1}, group 1 is {2, 3}.
		// mean 1.75; squared deviations 0.5625, 0.0625, 0.5625, 1.5625: variance 2.75/4.
		{"interleaved groups", []float64{1, 2, 1, 3}, []int{0, 1, 0, 1}, Stats{Mean: 1.75, Std: math.Sqrt(0.6875), ZeroVarGroups: 0.5}},
		// Three groups of three: {0,0,0} {1,0,1} {5,5,5}; mean 17/9.
		{"three groups", []float64{0, 0, 0, 1, 0, 1, 5, 5, 5}, []int{0, 0, 0, 1, 1, 1, 2, 2, 2},
			Stats{Mean: 17.0 / 9, Std: math.Sqrt((3*(17.0/9)*(17.0/9) + 2*(8.0/9)*(8.0/9) + (17.0/9)*(17.0/9) + 3*(28.0/9)*(28.0/9)) / 9), ZeroVarGroups: 2.0 / 3}},
		{"no group without variance", []float64{0, 1, 0, 1}, []int{0, 0, 1, 1}, Stats{Mean: 0.5, Std: 0.5, ZeroVarGroups: 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Summarize(tt.rewards, tt.groups)
			if !near(got.Mean, tt.want.Mean) || !near(got.Std, tt.want.Std) || got.ZeroVarGroups != tt.want.ZeroVarGroups {
				t.Fatalf("Summarize = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestSummarizeLengthMismatch(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Summarize of 2 rewards and 1 group id did not panic")
		}
	}()
	Summarize([]float64{1, 2}, []int{0})
}

// near reports whether a and b agree to 1e-12 relative.
func near(a, b float64) bool {
	return math.Abs(a-b) <= 1e-12*max(1, math.Abs(a), math.Abs(b))
}
