package stages

import (
	"fmt"
	"math"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
	"github.com/rlpipe/rlpipe/spec"
)

// fusingBackend is the CPU backend with the fused gate/up product and
// SwiGLU of a GPU backend (model.LayerActs.Transient): it refuses an act
// that shares bytes with x or the weights, as a kernel whose CTAs write
// act while others still read x would compute garbage, and otherwise
// gives the unfused path's bits.
type fusingBackend struct {
	gpu.Backend
	calls *atomic.Int64
}

func (b fusingBackend) GateUpSwiGLU(act, x, gate, up gpu.Tensor) error {
	b.calls.Add(1)
	for _, o := range []struct {
		name string
		t    gpu.Tensor
	}{{"x", x}, {"gate", gate}, {"up", up}} {
		if gpu.Overlap(act, o.t) {
			return fmt.Errorf("test gate/up swiglu: act [%d,+%d) overlaps %s [%d,+%d)", act.Off, act.Bytes(), o.name, o.t.Off, o.t.Bytes())
		}
	}
	t, n := act.Shape[0], act.Shape[1]
	mem, err := b.Alloc(int64(2 * t * n * act.DType.Size()))
	if err != nil {
		return err
	}
	defer b.Free(mem)
	g, err := gpu.NewTensor(mem, 0, act.DType, t, n)
	if err != nil {
		return err
	}
	u, err := gpu.NewTensor(mem, g.Bytes(), act.DType, t, n)
	if err != nil {
		return err
	}
	if err := b.Gemm(g, x, gate, false, true, 1, 0); err != nil {
		return err
	}
	if err := b.Gemm(u, x, up, false, true, 1, 0); err != nil {
		return err
	}
	return b.SwiGLU(act, g, u)
}

// TestGateUpFusedPlan runs the tiny job on a backend that fuses the gate/up
// product with SwiGLU in the ref and actor log-prob forwards: the plan must
// keep act's bytes apart from xn2's from the gate/up op on (a transient
// forward writes act there), and the steps must match the unfused run's.
func TestGateUpFusedPlan(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	for _, tc := range []struct {
		name      string
		precision string
	}{{"f32", ""}, {"bf16", `"bf16"`}} {
		t.Run(tc.name, func(t *testing.T) {
			mutate := func(s *spec.Spec) {
				s.Train.Steps = 2
				if tc.precision != "" {
					setPolicies(t, s, map[string]string{"precision": tc.precision})
				}
			}
			want := runParsed(t, variant(t, path), mutate, nil, RunOptions{})
			var calls atomic.Int64
			got := runParsed(t, variant(t, path), mutate, nil, RunOptions{
				Backend: func(int) (gpu.Backend, error) { return fusingBackend{Backend: cpu.New(), calls: &calls}, nil },
			})
			if calls.Load() == 0 {
				t.Fatal("no forward took the fused gate/up product")
			}
			if len(got.steps) != len(want.steps) {
				t.Fatalf("%d steps fused, %d not", len(got.steps), len(want.steps))
			}
			for i, sr := range got.steps {
				w := want.steps[i]
				if math.Float64bits(sr.Stats.GradNorm) != math.Float64bits(w.Stats.GradNorm) {
					t.Errorf("step %d: grad_norm %.9g fused, %.9g not", sr.Step, sr.Stats.GradNorm, w.Stats.GradNorm)
				}
				for k, v := range w.Stats.Values {
					if g := sr.Stats.Values[k]; math.Float64bits(g) != math.Float64bits(v) {
						t.Errorf("step %d: %s %.9g fused, %.9g not", sr.Step, k, g, v)
					}
				}
			}
		})
	}
}
