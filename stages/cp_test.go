package stages

import (
	"fmt"
	"math"
	"sort"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/spec"
)

// cpRun is what TestContextParallel compares between meshes.
type cpRun struct {
	steps  []StepResult
	old    map[int][]float32 // actor_logprob's output by step
	ref    map[int][]float32
	params map[string][]float32 // the actor's parameters after the run
	grads  map[string][]float32 // the actor's grads of the run's last update
	peak   []int64
	plan   int64
}

// runMesh runs s on a dp × cp mesh of loopback ranks, with the actor
// exported from memory.
func runMesh(t *testing.T, s *spec.Spec, dp, cp int) cpRun {
	t.Helper()
	s.Mesh.GPUsPerNode, s.Mesh.DP, s.Mesh.CP = dp*cp, dp, cp
	out := cpRun{old: map[int][]float32{}, ref: map[int][]float32{}, params: map[string][]float32{}, grads: map[string][]float32{}}
	grads := make([]ShardRows, s.Mesh.WorldSize())
	j := resolveSpec(t, s)
	p, err := Plan(j)
	if err != nil {
		t.Fatal(err)
	}
	out.plan = p.PeakBytes
	// The grads live through an update (update_grads.go): each rank's
	// are read at every optimizer op of the last step, the last update's
	// kept.
	defer func() { gradsSeen = nil }()
	gradsSeen = func(r *Rank, st *ShardState, view func(u *Unit, s model.Slot) (gpu.Tensor, error)) error {
		if r.Step != s.Train.Steps || st.Model.Name() != "actor" {
			return nil
		}
		g, err := r.shardRows("actor", func(_ *ShardState, u *Unit, s model.Slot) (gpu.Tensor, error) { return view(u, s) })
		grads[r.ID] = g
		return err
	}
	res, err := Run(t.Context(), j, p, RunOptions{Export: "actor", AfterStep: func(r *Rank, sr StepResult) error {
		if r.ID == 0 {
			out.steps = append(out.steps, sr)
			out.old[sr.Step] = r.values["old_logp.logp"].(*TokenValues).Values
			out.ref[sr.Step] = r.values["ref_logp.logp"].(*TokenValues).Values
		}
		return nil
	}})
	if err != nil {
		t.Fatalf("dp %d cp %d: %v", dp, cp, err)
	}
	for _, r := range res.Ranks {
		hw, _ := r.Arena.HighWater()
		out.peak = append(out.peak, hw)
	}
	// Every rank holds consecutive rows of every parameter: in rank order
	// they make the whole tensor.
	for r, rows := range res.Export {
		for name, v := range rows {
			out.params[name] = append(out.params[name], v...)
		}
		for name, v := range grads[r] {
			out.grads[name] = append(out.grads[name], v...)
		}
	}
	return out
}

// TestContextParallel runs the tiny job's real step (two mini-batch
// updates per step, the reference and actor log-prob stages, KL and
// entropy terms; the even layers recomputed) with every sequence split
// over cp = 2 and 4 ranks, also within a dp 2 mesh, and checks it against cp
// 1: every step's grad norm and loss metrics, the token count, every
// token's log-probs of both log-prob stages and the last update's grads,
// to 1e-4 (fp32), and the parameters after the run (see below). Each rank's arena high-water mark must
// equal the plan's peak.
func TestContextParallel(t *testing.T) {
	base := func(t *testing.T, edits ...string) *spec.Spec {
		s := tinyVariant(t, edits...)
		s.Train.Steps = 2
		return s
	}
	ref := runMesh(t, base(t), 1, 1)
	// dp 4 × cp 1 is the control: data parallelism alone must meet the
	// same bounds (its parameters differ from dp 1 by as much).
	for _, tc := range []struct{ dp, cp int }{{1, 2}, {1, 4}, {2, 2}, {4, 1}} {
		t.Run(fmt.Sprintf("dp %d cp %d", tc.dp, tc.cp), func(t *testing.T) {
			got := runMesh(t, base(t), tc.dp, tc.cp)
			for r, hw := range got.peak {
				if hw != got.plan {
					t.Errorf("rank %d: arena high-water %d, plan peak %d", r, hw, got.plan)
				}
			}
			close := func(what string, g, w float64) {
				t.Helper()
				if d := math.Abs(g - w); d > 1e-4*math.Max(math.Abs(w), 1e-2) {
					t.Errorf("%s = %.8g, want %.8g (cp 1)", what, g, w)
				}
			}
			if len(got.steps) != len(ref.steps) {
				t.Fatalf("%d steps, want %d", len(got.steps), len(ref.steps))
			}
			for i, sr := range got.steps {
				w := ref.steps[i]
				if len(sr.Stats.Updates) != len(w.Stats.Updates) {
					t.Fatalf("step %d: %d updates, want %d", sr.Step, len(sr.Stats.Updates), len(w.Stats.Updates))
				}
				for k, u := range sr.Stats.Updates {
					wu := w.Stats.Updates[k]
					close(fmt.Sprintf("step %d update %d grad_norm", sr.Step, k), u.GradNorm, wu.GradNorm)
					if u.Tokens != wu.Tokens {
						t.Errorf("step %d update %d: %d tokens, want %d", sr.Step, k, u.Tokens, wu.Tokens)
					}
					names := make([]string, 0, len(wu.Values))
					for name := range wu.Values {
						names = append(names, name)
					}
					sort.Strings(names)
					for _, name := range names {
						close(fmt.Sprintf("step %d update %d %s", sr.Step, k, name), u.Values[name], wu.Values[name])
					}
				}
				for what, vals := range map[string][2][]float32{"actor_logprob": {got.old[sr.Step], ref.old[sr.Step]},
					"ref_logprob": {got.ref[sr.Step], ref.ref[sr.Step]}} {
					g, w := vals[0], vals[1]
					if len(g) != len(w) {
						t.Fatalf("step %d: %s has %d values, want %d", sr.Step, what, len(g), len(w))
					}
					worst := 0.0
					for k := range w {
						worst = max(worst, math.Abs(float64(g[k]-w[k])))
					}
					if worst > 1e-4 {
						t.Errorf("step %d: %s differs from cp 1 by up to %.3g", sr.Step, what, worst)
					}
				}
			}
			// The grads of the last update agree to 1e-4 of the largest
			// grad of their tensor. The parameters after four AdamW
			// updates agree to 1e-3 of their tensor's largest (about 1e-4
			// absolute, a thirtieth of the LR): AdamW divides each grad by
			// its own running RMS, so an element whose first grads are
			// within rounding of 0 moves by a rounding-dependent fraction
			// of the LR (seen: 1.7e-5 at cp 4, where its last grads agree
			// to 7 digits).
			compareTensors(t, "grad", got.grads, ref.grads, 1e-4)
			compareTensors(t, "parameter", got.params, ref.params, 1e-3)
		})
	}
}

// compareTensors checks every tensor of got against want: each element
// within tol of the tensor's largest magnitude (tol 0: equal).
func compareTensors(t *testing.T, what string, got, want map[string][]float32, tol float64) {
	t.Helper()
	if len(got) != len(want) || len(want) == 0 {
		t.Fatalf("%d %ss, want %d", len(got), what, len(want))
	}
	for name, w := range want {
		g := got[name]
		if len(g) < len(w) {
			t.Fatalf("%s %s: %d values, want %d", what, name, len(g), len(w))
		}
		scale := 0.0
		for _, x := range w {
			scale = max(scale, math.Abs(float64(x)))
		}
		worst := 0.0
		for k := range w {
			worst = max(worst, math.Abs(float64(g[k]-w[k]))/math.Max(scale, 1e-12))
		}
		if worst > tol {
			t.Errorf("%s %s differs by up to %.3g of its largest magnitude", what, name, worst)
		}
	}
}
