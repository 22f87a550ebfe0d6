package stages

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
	"github.com/rlpipe/rlpipe/gpu/lazy"
)

// TestHostUpdateOverlap runs the offloaded tiny job (params and optimizer
// state in host memory, so AdamW runs on the host) with the host AdamW in
// the background, as runs do, and finished within its op
// (SyncHostOptimizer): every update's metrics, the exported params and a
// checkpoint (1-D shard tensors) taken between steps must be bitwise the
// same. The job makes two updates a step (two mini-batches), syncs the ref
// from the actor every other step, and runs on 2 ranks (TestPolicyVariants
// runs the offloaded job on 1); a reader that does not wait for a unit's
// pending update is a data race that go test -race reports. The serial run
// also sums every grad's squares on the host in the optimizer op; the
// other takes the device's sums of the staged grads (deviceNorms) where an
// update has one micro-batch and a unit no tied slot, and must have used
// them as the case says; its side and Down streams run their work only
// when waited for (gpu/lazy).
func TestHostUpdateOverlap(t *testing.T) {
	// tiny-qwen2 has 4 units: the embedding (tied: the head's grads add
	// into its shard), 2 layers and the head (with the tied slot); 3 steps
	// of 2 updates on 2 ranks.
	const updates = 3 * 2 * 2
	for _, c := range []struct {
		name  string
		edits []string
		dev   int // sums of squares taken from deviceNorms
	}{
		{"one micro-batch", nil, updates * 2},
		{"micro-batches", []string{"  max_tokens_per_gpu: 768\n", "  max_tokens_per_gpu: 256\n"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) { testHostUpdateOverlap(t, c.edits, c.dev) })
	}
}

func testHostUpdateOverlap(t *testing.T, more []string, wantDev int) {
	edits := []string{
		"  global_batch_size: 64\n", "  global_batch_size: 64\n  rollout_batch_size: 16\n",
		"  steps: 12\n", "  steps: 3\n",
		"when: step % 6 == 0", "when: step % 2 == 0",
		"  recompute: 'layer.index % 2 == 0'\n", "  recompute: 'layer.index % 2 == 0'\n  offload: 'model.trainable'\n  offload_optimizer: 'model.trainable'\n",
		// The paths without apply_fsdp2's options: every micro-batch's
		// grads cross to the host, and every gather reads the masters.
		"      with: {model: actor}\n    - id: shard_ref", "      with: {model: actor, gather_once: false, accumulate_grads_on_device: false}\n    - id: shard_ref",
	}
	edits = append(edits, more...)
	const dp = 2
	type result struct {
		updates [][]UpdateStats
		export  ShardRows
		ckpt    string // the checkpoint taken after step 2
		dev     int    // units' sums of squares taken from deviceNorms
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
		defer func(v bool) { deviceNormsOn, normsServed = v, nil }(deviceNormsOn)
		deviceNormsOn = !serial
		normsServed = func(n int) {
			mu.Lock()
			out.dev += n
			mu.Unlock()
		}
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
		if !serial {
			// The overlapped run's streams run their work only when waited
			// for (gpu/lazy), the host's background updates beside them.
			opts.Backend = func(int) (gpu.Backend, error) { return lazy.New(cpu.New()), nil }
			opts.Comms = streamComms
		}
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
	if want.dev != 0 || got.dev != wantDev {
		t.Errorf("sums of squares from the device: %d serial, %d overlapped; want 0 and %d", want.dev, got.dev, wantDev)
	}
	compareTensors(t, "export tensor", got.export, want.export, 0)
	for r := range dp {
		sameTensors(t, rankDir(got.ckpt, r), rankDir(want.ckpt, r))
	}
}
