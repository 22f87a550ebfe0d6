package rl

import (
	"math"
	"reflect"
	"testing"
)

func TestMetricsAddValues(t *testing.T) {
	a := Metrics{Samples: 2, Tokens: 10, Loss: 1, PGLoss: 2, PGClipFrac: 0.5, DualClipFrac: 0.25, PPOKL: 0.1, Ratio: 2,
		KLLoss: 0.2, EntropyLoss: 3, MismatchAbs: 0.3, MismatchK3: 0.05, TISWeight: 0.9, TISClipFrac: 0.125}
	base := map[string]float64{"loss": 2, "pg_loss": 4, "pg_clipfrac": 1, "pg_dualclipfrac": 0.5, "ppo_kl": 0.2,
		"ratio": 4, "kl_loss": 0.4, "entropy_loss": 6}
	tests := []struct {
		name          string
		rollout, tis  int
		mismatch, tTS bool
	}{
		{"no rollout log-probs", 0, 0, false, false},
		{"rollout log-probs without tis", 1, 0, true, false},
		{"tis", 2, 2, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var sum Metrics
			a.RolloutSamples, a.TISSamples = tt.rollout, tt.tis
			sum.Add(a)
			sum.Add(a)
			if sum.Samples != 4 || sum.Tokens != 20 || sum.RolloutSamples != 2*tt.rollout || sum.TISSamples != 2*tt.tis {
				t.Fatalf("counts = %d, %v, %d, %d", sum.Samples, sum.Tokens, sum.RolloutSamples, sum.TISSamples)
			}
			want := map[string]float64{}
			for k, v := range base {
				want[k] = v
			}
			if tt.mismatch {
				want["mismatch_abs"], want["mismatch_k3"] = 0.6, 0.1
			}
			if tt.tTS {
				want["tis_weight"], want["tis_clipfrac"] = 1.8, 0.25
			}
			got := sum.Values()
			if len(got) != len(want) {
				t.Fatalf("got %v, want %v", got, want)
			}
			for k, v := range want {
				g, ok := got[k]
				if !ok || math.Abs(g-v) > 1e-12 {
					t.Fatalf("%s = %v (present %v), want %v", k, g, ok, v)
				}
			}
		})
	}
}

// TestMetricsVector checks that Vector and MetricsFromVector round-trip
// every field and that vectors add like Add.
func TestMetricsVector(t *testing.T) {
	a := Metrics{Samples: 3, Tokens: 7.5, RolloutSamples: 2, TISSamples: 1, Loss: 0.25, PGLoss: -0.5, PGClipFrac: 0.125,
		DualClipFrac: 0.0625, PPOKL: 0.01, Ratio: 1.02, KLLoss: 0.003, EntropyLoss: 4.5, MismatchAbs: 0.2, MismatchK3: 0.02,
		TISWeight: 0.9, TISClipFrac: 0.1}
	b := a
	b.Samples, b.Loss, b.TISClipFrac = 5, -1, 0.3
	if n := reflect.TypeFor[Metrics]().NumField(); n != MetricsLen {
		t.Errorf("Metrics has %d fields and Vector %d values: a new field must go into Vector", n, MetricsLen)
	}
	if v := a.Vector(); len(v) != MetricsLen {
		t.Fatalf("Vector has %d values, want %d", len(v), MetricsLen)
	}
	if got := MetricsFromVector(a.Vector()); got != a {
		t.Errorf("round trip %+v, want %+v", got, a)
	}
	sum := a.Vector()
	for i, x := range b.Vector() {
		sum[i] += x
	}
	want := a
	want.Add(b)
	if got := MetricsFromVector(sum); got != want {
		t.Errorf("summed vectors give %+v, want Add's %+v", got, want)
	}
}
