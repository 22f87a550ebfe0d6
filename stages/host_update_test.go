package stages

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/rlpipe/rlpipe/model"
)

// TestHostUpdateOverlap runs the offloaded tiny job (params and optimizer
// state in host memory, so AdamW runs on the host) with the host AdamW in
// the background, as runs do, and finished within its op
// (SyncHostOptimizer): every update's metrics, the exported params and a
// checkpoint (1-D shard tensors) taken between steps must be bitwise the
// same. The job makes two updates a step (two mini-batches), syncs the ref
// from the actor every other step, and runs on 2 ranks (TestPolicyVariants
// runs the offloaded job on 1); a reader that does not wait for a unit's
// pending update is a data race that go test -race reports.
func TestHostUpdateOverlap(t *testing.T) {
	edits := []string{
		"  global_batch_size: 64\n", "  global_batch_size: 64\n  rollout_batch_size: 16\n",
		"  steps: 12\n", "  steps: 3\n",
		"when: step % 6 == 0", "when: step % 2 == 0",
		"  recompute: 'layer.index % 2 == 0'\n", "  recompute: 'layer.index % 2 == 0'\n  offload: 'model.trainable'\n  offload_optimizer: 'model.trainable'\n",
	}
	type result struct {
		updates [][]UpdateStats
		export  ShardRows
		ckpt    map[string][]float32 // actor's moments and params at step 2, rank 0
	}
	run := func(t *testing.T, dp int, serial bool) result {
		s := variant(t, filepath.Join("..", "examples", "tiny-grpo.yaml"), edits...)
		s.Mesh.GPUsPerNode, s.Mesh.DP = dp, dp
		j := resolveSpec(t, s)
		if m := j.Models["actor"]; !m.Offload || !m.OffloadOptimizer {
			t.Fatal("the actor is not offloaded: the test checks nothing")
		}
		p, err := Plan(j)
		if err != nil {
			t.Fatal(err)
		}
		var out result
		var mu sync.Mutex
		ckpt := t.TempDir()
		opts := RunOptions{FirstStep: 1, Steps: 3, Export: "actor", SyncHostOptimizer: serial,
			AfterStep: func(r *Rank, sr StepResult) error {
				if sr.Step == 2 {
					if err := r.SaveShards(ckpt); err != nil {
						return err
					}
				}
				if r.ID == 0 {
					mu.Lock()
					out.updates = append(out.updates, sr.Stats.Updates)
					mu.Unlock()
				}
				return nil
			}}
		res, err := Run(context.Background(), j, p, opts)
		if err != nil {
			t.Fatal(err)
		}
		out.export = res.Export[0]
		out.ckpt = readCheckpointTensors(t, rankDir(ckpt, 0))
		return out
	}
	for _, dp := range []int{2} {
		want := run(t, dp, true)
		got := run(t, dp, false)
		if len(got.updates) != 3 || len(want.updates) != 3 {
			t.Fatalf("dp %d: %d and %d steps, want 3", dp, len(got.updates), len(want.updates))
		}
		for s := range want.updates {
			if len(want.updates[s]) != 2 {
				t.Fatalf("dp %d step %d: %d updates, want 2", dp, s+1, len(want.updates[s]))
			}
			for k, w := range want.updates[s] {
				g := got.updates[s][k]
				if g.GradNorm != w.GradNorm || g.LR != w.LR || g.Tokens != w.Tokens {
					t.Errorf("dp %d step %d update %d: grad_norm %v lr %v tokens %d, want %v %v %d", dp, s+1, k+1, g.GradNorm, g.LR, g.Tokens, w.GradNorm, w.LR, w.Tokens)
				}
				for name, v := range w.Values {
					if g.Values[name] != v {
						t.Errorf("dp %d step %d update %d: %s = %v, want %v", dp, s+1, k+1, name, g.Values[name], v)
					}
				}
			}
		}
		equalTensors(t, "export", got.export, want.export)
		equalTensors(t, "checkpoint", got.ckpt, want.ckpt)
	}
}

// equalTensors reports every tensor of want that got lacks or holds other
// values in.
func equalTensors(t *testing.T, what string, got, want map[string][]float32) {
	t.Helper()
	if len(want) == 0 {
		t.Fatalf("%s: no tensors", what)
	}
	for name, w := range want {
		if !slices.Equal(got[name], w) {
			t.Errorf("%s: tensor %s differs", what, name)
		}
	}
}

// readCheckpointTensors reads every tensor of a rank's checkpoint file.
func readCheckpointTensors(t *testing.T, dir string) map[string][]float32 {
	t.Helper()
	ck, err := model.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	out := map[string][]float32{}
	for _, name := range ck.Names() {
		info, _, _ := ck.Tensor(name)
		data := make([]float32, info.NumElements())
		if err := ck.ReadRows(name, 0, int64(len(data)), data); err != nil {
			t.Fatal(err)
		}
		out[name] = data
	}
	return out
}
