package stages

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
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
	const dp = 2
	type result struct {
		updates [][]UpdateStats
		export  ShardRows
		ckpt    string // the checkpoint taken after step 2
	}
	run := func(t *testing.T, serial bool) result {
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
		out := result{ckpt: t.TempDir()}
		var mu sync.Mutex
		opts := RunOptions{FirstStep: 1, Steps: 3, Export: "actor", SyncHostOptimizer: serial,
			AfterStep: func(r *Rank, sr StepResult) error {
				if sr.Step == 2 {
					if err := r.SaveShards(out.ckpt); err != nil {
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
		return out
	}
	want := run(t, true)
	got := run(t, false)
	if len(got.updates) != 3 || len(want.updates) != 3 {
		t.Fatalf("%d and %d steps, want 3", len(got.updates), len(want.updates))
	}
	for s := range want.updates {
		if len(want.updates[s]) != 2 {
			t.Fatalf("step %d: %d updates, want 2", s+1, len(want.updates[s]))
		}
		for k, w := range want.updates[s] {
			g := got.updates[s][k]
			if g.GradNorm != w.GradNorm || g.LR != w.LR || g.Tokens != w.Tokens {
				t.Errorf("step %d update %d: grad_norm %v lr %v tokens %d, want %v %v %d", s+1, k+1, g.GradNorm, g.LR, g.Tokens, w.GradNorm, w.LR, w.Tokens)
			}
			for name, v := range w.Values {
				if g.Values[name] != v {
					t.Errorf("step %d update %d: %s = %v, want %v", s+1, k+1, name, g.Values[name], v)
				}
			}
		}
	}
	compareTensors(t, "export tensor", got.export, want.export, 0)
	for r := range dp {
		sameTensors(t, rankDir(got.ckpt, r), rankDir(want.ckpt, r))
	}
}
