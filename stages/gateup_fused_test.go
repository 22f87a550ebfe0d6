package stages

import (
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
	"github.com/rlpipe/rlpipe/spec"
)

// fusingBackend is the CPU backend with the fused gate/up product and
// SwiGLU of a GPU backend, without and with the products kept
// (model.LayerActs.Transient), run as its steps (gpu.GateUpSwiGLUSteps,
// gpu.GateUpSwiGLUKeepSteps): it refuses outputs that share bytes with x,
// the weights or each other, as a kernel whose CTAs write act while others
// still read x would compute garbage, and otherwise gives the unfused
// path's bits.
type fusingBackend struct {
	gpu.Backend
	calls, keeps *atomic.Int64
}

func (b fusingBackend) GateUpSwiGLU(act, x, gate, up gpu.Tensor) error {
	b.calls.Add(1)
	return gpu.GateUpSwiGLUSteps(b.Backend, act, x, gate, up)
}

func (b fusingBackend) GateUpSwiGLUKeep(act, gOut, uOut, x, gate, up gpu.Tensor) error {
	b.keeps.Add(1)
	return gpu.GateUpSwiGLUKeepSteps(b.Backend, act, gOut, uOut, x, gate, up)
}

// TestGateUpFusedPlan runs the tiny job on a backend that fuses the gate/up
// product with SwiGLU in the ref and actor log-prob forwards, and keeps the
// products in the train stage's forwards and reruns: the plan must keep
// act's bytes apart from xn2's from the gate/up op on (every forward writes
// act there), and the steps must match the unfused run's.
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
			var calls, keeps atomic.Int64
			got := runParsed(t, variant(t, path), mutate, nil, RunOptions{
				Backend: func(int) (gpu.Backend, error) {
					return fusingBackend{Backend: cpu.New(), calls: &calls, keeps: &keeps}, nil
				},
			})
			if calls.Load() == 0 || keeps.Load() == 0 {
				t.Fatalf("%d log-prob forwards took the fused gate/up product and %d training ones kept its products, want both", calls.Load(), keeps.Load())
			}
			sameSteps(t, got, want, "fused", "not")
		})
	}
}
