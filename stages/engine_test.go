package stages

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rlpipe/rlpipe/runtime"
	"github.com/rlpipe/rlpipe/spec"
)

type runOut struct {
	steps []StepResult // rank 0
	peak  []int64      // per rank: arena high-water
	plan  int64
}

// runSpec resolves, plans and runs a spec file on the CPU backend.
func runSpec(t *testing.T, path string, mutate func(s *spec.Spec)) runOut {
	t.Helper()
	s, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if mutate != nil {
		mutate(s)
	}
	g, err := runtime.NewGraph(s)
	if err != nil {
		t.Fatal(err)
	}
	var order []*spec.Stage
	for _, ph := range []spec.Phase{spec.Setup, spec.Step} {
		for _, n := range g.Order(ph) {
			order = append(order, n.Stage)
		}
	}
	j, err := Resolve(s, order, GPU{Name: "cpu", Bytes: 1 << 34, Source: "test"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := Plan(j)
	if err != nil {
		t.Fatal(err)
	}
	data, err := ReadData(j)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	out := runOut{plan: p.PeakBytes}
	res, err := Run(context.Background(), j, g, p, data, RunOptions{AfterStep: func(r *Rank, sr StepResult) error {
		if r.ID == 0 {
			mu.Lock()
			out.steps = append(out.steps, sr)
			mu.Unlock()
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Ranks {
		hw, _ := r.Arena.HighWater()
		out.peak = append(out.peak, hw)
	}
	return out
}

func TestRunTiny(t *testing.T) {
	out := runSpec(t, filepath.Join("..", "examples", "tiny-grpo.yaml"), nil)
	for _, sr := range out.steps {
		t.Logf("step %d: %v grad_norm %.4f lr %.2e tokens %d", sr.Step, sr.Stats.Values, sr.Stats.GradNorm, sr.Stats.LR, sr.Tokens)
	}
	if out.peak[0] != out.plan {
		t.Errorf("arena high-water %d, plan peak %d", out.peak[0], out.plan)
	}
}
