package stages

import (
	"fmt"
	"math"
	"testing"

	"github.com/rlpipe/rlpipe/spec"
)

// TestEightRanks runs one real step of the tiny job (tinyVariant's: two
// mini-batch updates) on eight loopback ranks, the world of an 8-GPU host, as
// dp 8 and as dp 4 × cp 2, and holds it to one rank with the bounds of
// TestRanksAgree and TestContextParallel: every update's grad norm, token
// count and loss metrics to 1e-4 relative, every token's log-probs of both
// log-prob stages to 1e-4, the last update's grads to 1e-4 and the
// parameters after the run to 1e-3 of their tensor's largest; and every
// rank's arena high-water mark equal to the plan's peak. (TestRanksAgree
// and TestContextParallel stop at four ranks.)
func TestEightRanks(t *testing.T) {
	oneStep := func() *spec.Spec {
		s := tinyVariant(t)
		s.Train.Steps = 1
		return s
	}
	ref := runMesh(t, oneStep(), 1, 1)
	for _, tc := range []struct{ dp, cp int }{{8, 1}, {4, 2}} {
		t.Run(fmt.Sprintf("dp %d cp %d", tc.dp, tc.cp), func(t *testing.T) {
			got := runMesh(t, oneStep(), tc.dp, tc.cp)
			if len(got.peak) != 8 {
				t.Fatalf("%d ranks ran, want 8", len(got.peak))
			}
			for r, hw := range got.peak {
				if hw != got.plan {
					t.Errorf("rank %d: arena high-water %d, plan peak %d", r, hw, got.plan)
				}
			}
			want, have := updateScalars(ref), updateScalars(got)
			if len(have) != len(want) || len(want) == 0 {
				t.Fatalf("%d update values, want %d", len(have), len(want))
			}
			for k, w := range want {
				if g, ok := have[k]; !ok || math.Abs(g-w) > 1e-4*math.Max(math.Abs(w), 1e-2) {
					t.Errorf("%s = %.8g, want %.8g (1 rank)", k, g, w)
				}
			}
			for step, w := range ref.old {
				maxAbsDiff(t, fmt.Sprintf("step %d actor_logprob", step), got.old[step], w, 1e-4)
				maxAbsDiff(t, fmt.Sprintf("step %d ref_logprob", step), got.ref[step], ref.ref[step], 1e-4)
			}
			compareTensors(t, "grad", got.grads, ref.grads, 1e-4)
			compareTensors(t, "parameter", got.params, ref.params, 1e-3)
		})
	}
}

// updateScalars flattens a run's per-update values (grad norm, tokens and
// every loss metric), keyed by step, update and name.
func updateScalars(r cpRun) map[string]float64 {
	out := map[string]float64{}
	for _, sr := range r.steps {
		for k, u := range sr.Stats.Updates {
			key := fmt.Sprintf("step %d update %d ", sr.Step, k)
			out[key+"grad_norm"], out[key+"tokens"] = u.GradNorm, float64(u.Tokens)
			for name, v := range u.Values {
				out[key+name] = v
			}
		}
	}
	return out
}

// maxAbsDiff checks that got has want's length and every value within tol
// of want's.
func maxAbsDiff(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) || len(want) == 0 {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	worst := 0.0
	for i := range want {
		worst = max(worst, math.Abs(float64(got[i]-want[i])))
	}
	if worst > tol {
		t.Errorf("%s differs from 1 rank by up to %.3g", what, worst)
	}
}
