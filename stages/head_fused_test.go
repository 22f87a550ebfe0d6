package stages

import (
	"math"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
	"github.com/rlpipe/rlpipe/spec"
)

// lpFusingBackend is the CPU backend with a GPU backend's log-probs that
// hold no logits (model's logProbsFuser): LogProbs' bits, and then NaN over
// the whole workspace, as the fused op leaves no logits there.
type lpFusingBackend struct {
	gpu.Backend
	calls *atomic.Int64
}

func (b lpFusingBackend) LogProbsFused(logp, h, w, targets gpu.Tensor, temperature float32, scratch gpu.Tensor) error {
	b.calls.Add(1)
	if err := b.LogProbs(logp, gpu.Tensor{}, h, w, targets, temperature, false, scratch, gpu.Tensor{}); err != nil {
		return err
	}
	return b.Fill(scratch, float32(math.NaN()))
}

// TestHeadFusedRun runs the tiny job on a backend whose log-prob forwards
// without entropies leave NaN in the logits workspace: some forward must
// take the fused op, and the steps must match the plain run's bit for bit,
// so that nothing after such a forward reads the workspace as logits.
func TestHeadFusedRun(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	mutate := func(s *spec.Spec) { s.Train.Steps = 2 }
	want := runParsed(t, variant(t, path), mutate, nil, RunOptions{})
	var calls atomic.Int64
	got := runParsed(t, variant(t, path), mutate, nil, RunOptions{
		Backend: func(int) (gpu.Backend, error) { return lpFusingBackend{Backend: cpu.New(), calls: &calls}, nil },
	})
	if calls.Load() == 0 {
		t.Fatal("no log-prob forward took the fused op")
	}
	sameSteps(t, got, want, "fused", "not")
}
