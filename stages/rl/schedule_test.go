package rl

import (
	"math"
	"strings"
	"testing"
)

func TestScheduleAt(t *testing.T) {
	base := Schedule{LR: 1, MinLR: 0.1, WarmupInitLR: 0, WarmupSteps: 10, DecaySteps: 110}
	with := func(decay string) Schedule { s := base; s.Decay = decay; return s }
	cos := func(r float64) float64 { return 0.1 + 0.9*0.5*(math.Cos(math.Pi*r)+1) }
	tests := []struct {
		name  string
		s     Schedule
		steps []int
		want  []float64
	}{
		{"warmup", with("cosine"), []int{-3, 0, 1, 5, 10}, []float64{0, 0, 0.1, 0.5, 1}},
		{"warmup from init", Schedule{LR: 2, WarmupInitLR: 1, WarmupSteps: 4, Decay: "constant"},
			[]int{0, 2, 4, 5}, []float64{1, 1.5, 2, 2}},
		{"constant", with("constant"), []int{10, 11, 110, 1000}, []float64{1, 1, 1, 1}},
		{"empty is constant", with(""), []int{11, 1000}, []float64{1, 1}},
		{"linear", with("linear"), []int{11, 60, 109, 110, 111, 5000},
			[]float64{0.1 + 0.9*0.99, 0.55, 0.1 + 0.9*0.01, 0.1, 0.1, 0.1}},
		{"cosine", with("cosine"), []int{11, 35, 60, 110, 111},
			[]float64{cos(0.01), cos(0.25), 0.55, 0.1, 0.1}},
		{"no warmup linear", Schedule{LR: 1, MinLR: 0, DecaySteps: 4, Decay: "linear"},
			[]int{0, 1, 4, 5}, []float64{1, 0.75, 0, 0}},
		{"no warmup cosine", Schedule{LR: 1, MinLR: 0, DecaySteps: 2, Decay: "cosine"},
			[]int{0, 1, 2}, []float64{1, 0.5, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.s.Validate(); err != nil {
				t.Fatalf("schedule invalid: %v", err)
			}
			got := make([]float64, len(tt.steps))
			for i, st := range tt.steps {
				got[i] = tt.s.At(st)
			}
			assertClose(t, "lr", got, tt.want, 1e-12)
		})
	}
}

func TestScheduleValidate(t *testing.T) {
	tests := []struct {
		name string
		s    Schedule
		want string
	}{
		{"negative lr", Schedule{LR: -1}, "lr"},
		{"nan lr", Schedule{LR: math.NaN()}, "lr"},
		{"min above lr", Schedule{LR: 1, MinLR: 2}, "min_lr"},
		{"init above lr", Schedule{LR: 1, WarmupInitLR: 2}, "warmup_init_lr"},
		{"negative warmup", Schedule{LR: 1, WarmupSteps: -1}, "warmup_steps"},
		{"negative decay steps", Schedule{LR: 1, DecaySteps: -1}, "decay_steps"},
		{"decay within warmup", Schedule{LR: 1, WarmupSteps: 5, DecaySteps: 5, Decay: "linear"}, "decay_steps"},
		{"no decay steps cosine", Schedule{LR: 1, Decay: "cosine"}, "decay_steps"},
		{"unknown decay", Schedule{LR: 1, Decay: "wsd"}, "decay"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.s.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
	// An invalid schedule still returns a finite rate.
	if lr := (Schedule{LR: 1, WarmupSteps: 5, DecaySteps: 5, Decay: "linear"}).At(7); lr != 1 {
		t.Fatalf("invalid schedule At(7) = %v, want 1", lr)
	}
}

func TestClipCoef(t *testing.T) {
	tests := []struct {
		name            string
		total, max, out float64
	}{
		{"clips", 2, 1, 1 / (2 + 1e-6)},
		{"below max", 0.5, 1, 1},
		{"zero norm", 0, 1, 1},
		{"equal", 1, 1, 1 / (1 + 1e-6)},
		{"off", 100, 0, 1},
		{"negative max off", 100, -1, 1},
		{"inf norm", math.Inf(1), 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ClipCoef(tt.total, tt.max); math.Abs(got-tt.out) > 1e-15 {
				t.Fatalf("ClipCoef(%v, %v) = %v, want %v", tt.total, tt.max, got, tt.out)
			}
		})
	}
	if !math.IsNaN(ClipCoef(math.NaN(), 1)) {
		t.Fatal("nan norm should give nan")
	}
}
