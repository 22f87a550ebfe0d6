package stages

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/spec"
)

// groupComm is a loopback communicator that offers the grouped
// collectives, as libnccl's does, and counts the calls.
type groupComm struct {
	nccl.Comm
	calls *groupCalls
}

type groupCalls struct {
	mu                                  sync.Mutex
	gatherGroups, reduceGroups, tensors int
}

func (c groupComm) On(s gpu.Stream) nccl.Comm { return groupComm{c.Comm.On(s), c.calls} }

func (c groupComm) AllGatherGroup(ctx context.Context, dst, src []gpu.Tensor) error {
	c.calls.mu.Lock()
	c.calls.gatherGroups++
	c.calls.tensors += len(src)
	c.calls.mu.Unlock()
	for i := range src {
		if err := c.AllGather(ctx, dst[i], src[i]); err != nil {
			return err
		}
	}
	return nil
}

func (c groupComm) ReduceScatterGroup(ctx context.Context, dst, src []gpu.Tensor, op nccl.Op) error {
	c.calls.mu.Lock()
	c.calls.reduceGroups++
	c.calls.tensors += len(src)
	c.calls.mu.Unlock()
	for i := range src {
		if err := c.ReduceScatter(ctx, dst[i], src[i], op); err != nil {
			return err
		}
	}
	return nil
}

// TestGroupedCollectives runs the tiny recipe at dp 2 over communicators
// that offer grouped all-gathers and reduce-scatters: the decoder hands
// every unit's slots to them together (one call a unit), and the step's
// results are those of the per-slot calls.
func TestGroupedCollectives(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-dp2.yaml")
	short := func(s *spec.Spec) { s.Train.Steps = 2 }
	base := runSpec(t, path, short)
	calls := &groupCalls{}
	s, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	out := runParsed(t, s, short, nil, RunOptions{Comms: func(bs []gpu.Backend) ([]nccl.Comm, error) {
		cs := nccl.NewLoopback(len(bs))
		for i := range cs {
			cs[i] = groupComm{cs[i], calls}
		}
		return cs, nil
	}})
	for _, sr := range out.steps {
		b := base.steps[sr.Step-1]
		if sr.Stats.GradNorm != b.Stats.GradNorm || sr.Stats.Values["loss"] != b.Stats.Values["loss"] {
			t.Errorf("step %d: grad norm %v loss %v grouped, %v %v per slot", sr.Step, sr.Stats.GradNorm, sr.Stats.Values["loss"], b.Stats.GradNorm, b.Stats.Values["loss"])
		}
	}
	if calls.gatherGroups == 0 || calls.reduceGroups == 0 || calls.tensors <= calls.gatherGroups+calls.reduceGroups {
		t.Errorf("%d gather groups, %d reduce groups, %d tensors: the units' slots did not go together", calls.gatherGroups, calls.reduceGroups, calls.tensors)
	}
	t.Logf("%d gather groups, %d reduce groups, %d tensors", calls.gatherGroups, calls.reduceGroups, calls.tensors)
}
