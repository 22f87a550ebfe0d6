package stages

import (
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
	"github.com/rlpipe/rlpipe/spec"
)

// fusingBackend is the CPU backend with the MLP's fused ops of a GPU
// backend, run as their steps: the gate/up product with SwiGLU, without
// and with the products kept (model.LayerActs.Transient;
// gpu.GateUpSwiGLUSteps, gpu.GateUpSwiGLUKeepSteps), and the down
// projection's input gradient with SwiGLU's backward
// (gpu.DownSwiGLUBackwardSteps). Each refuses outputs that share bytes
// with its inputs or each other, as a kernel whose CTAs write an output
// while others still read an input would compute garbage, and otherwise
// gives the unfused path's bits.
type fusingBackend struct {
	gpu.Backend
	calls, keeps, backs *atomic.Int64
}

func (b fusingBackend) GateUpSwiGLU(act, x, gate, up gpu.Tensor) error {
	b.calls.Add(1)
	return gpu.GateUpSwiGLUSteps(b.Backend, act, x, gate, up)
}

func (b fusingBackend) GateUpSwiGLUKeep(act, gOut, uOut, x, gate, up gpu.Tensor) error {
	b.keeps.Add(1)
	return gpu.GateUpSwiGLUKeepSteps(b.Backend, act, gOut, uOut, x, gate, up)
}

func (b fusingBackend) DownSwiGLUBackward(dGate, dUp, dy, down, gate, up gpu.Tensor) error {
	b.backs.Add(1)
	return gpu.DownSwiGLUBackwardSteps(b.Backend, dGate, dUp, dy, down, gate, up)
}

// TestFusedMLPPlan runs the tiny job on a backend that fuses the gate/up
// product with SwiGLU in the ref and actor log-prob forwards, keeps the
// products in the train stage's forwards and reruns, and takes the down
// projection's input gradient with SwiGLU's backward as one op: the plan
// must keep act's bytes apart from xn2's from the gate/up op on (every
// forward writes act there) and dgate's and dup's apart from dy's, gate's
// and up's in the down backward (the fused backward writes them there),
// and the steps must match the unfused run's.
func TestFusedMLPPlan(t *testing.T) {
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
			var calls, keeps, backs atomic.Int64
			got := runParsed(t, variant(t, path), mutate, nil, RunOptions{
				Backend: func(int) (gpu.Backend, error) {
					return fusingBackend{Backend: cpu.New(), calls: &calls, keeps: &keeps, backs: &backs}, nil
				},
			})
			if calls.Load() == 0 || keeps.Load() == 0 || backs.Load() == 0 {
				t.Fatalf("%d log-prob forwards took the fused gate/up product, %d training ones kept its products and %d backwards took the fused down product, want all three",
					calls.Load(), keeps.Load(), backs.Load())
			}
			sameSteps(t, got, want, "fused", "not")
		})
	}
}
