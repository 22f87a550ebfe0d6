package stages

import (
	"sync"
	"testing"
)

// TestTiedRows runs the tiny recipe (tied embeddings) on one rank with the
// actor and its optimizer offloaded, with and without tied_rows.go's path,
// against the run on the device. With one micro-batch an update, the
// head's grads of the embedding stay staged on the device, the embedding's
// reduction adds its own to them and sends the touched rows to host memory;
// with several, the host adds the embedding's touched rows to the earlier
// grads row by row. Either way the updates (grad
// norms, losses, metrics of two steps, the second from the first's
// weights) are those of the device run, bit for bit; in updates of one
// micro-batch the device serves the embedding's sum of squares with the
// layers' (the head's, with its tied slot, is the host's), and none in the
// others.
func TestTiedRows(t *testing.T) {
	testTiedRows(t, RunOptions{}, true)
}

// testTiedRows runs TestTiedRows' cases on base's backend, against the
// resident run if resident is set.
func testTiedRows(t *testing.T, base RunOptions, resident bool) {
	const steps = 2
	for _, c := range []struct {
		name   string
		tokens string // max_tokens_per_gpu
		served int    // units whose sums the device serves, per update
	}{
		{"one micro-batch", "  max_tokens_per_gpu: 4096\n", 3}, // the embedding and 2 layers
		{"several micro-batches", "  max_tokens_per_gpu: 768\n", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Without apply_fsdp2's options, which the offloaded actor
			// would otherwise take: its grads cross to the host each
			// micro-batch.
			edits := []string{"  max_tokens_per_gpu: 768\n", c.tokens, "  steps: 2\n", "  steps: 2\n",
				"      with: {model: actor}\n    - id: shard_ref", "      with: {model: actor, gather_once: false, accumulate_grads_on_device: false}\n    - id: shard_ref"}
			policies := []string{"  recompute: 'layer.index % 2 == 0'\n",
				"  recompute: 'layer.index % 2 == 0'\n  offload: 'model.trainable'\n  offload_optimizer: 'model.trainable'\n"}
			run := func(offload, rows, norms bool) ([]StepResult, int) {
				defer func(r, n bool) { tiedRowsOn, deviceNormsOn, normsServed = r, n, nil }(tiedRowsOn, deviceNormsOn)
				var mu sync.Mutex
				served := 0
				tiedRowsOn, deviceNormsOn = rows, norms
				normsServed = func(n int) {
					mu.Lock()
					served += n
					mu.Unlock()
				}
				e := edits
				if offload {
					e = append(append([]string(nil), edits...), policies...)
				}
				sp := tinyVariant(t, e...)
				sp.Mesh.GPUsPerNode, sp.Mesh.DP = 1, 1
				var job *Job
				out := runParsed(t, sp, nil, func(j *Job) { job = j }, RunOptions{Backend: base.Backend})
				if m := job.Models["actor"]; offload && (!m.Offload || !m.OffloadOptimizer || !m.Config.TieWordEmbeddings) {
					t.Fatal("the actor is not offloaded with tied embeddings: the test checks nothing")
				}
				if len(out.steps) != steps {
					t.Fatalf("%d steps, want %d", len(out.steps), steps)
				}
				return out.steps, served
			}
			// The host's sums throughout: the grads in host memory are the
			// same either way.
			on, _ := run(true, true, false)
			off, _ := run(true, false, false)
			sameUpdates(t, "offloaded, rows against host adds, host sums", on, off)
			withNorms, served := run(true, true, true)
			updates := 0
			for _, sr := range withNorms {
				updates += len(sr.Stats.Updates)
			}
			if updates == 0 {
				t.Fatal("no updates")
			}
			if want := c.served * updates; served != want {
				t.Errorf("sums of squares from the device: %d over %d updates, want %d", served, updates, want)
			}
			if resident {
				dev, _ := run(false, true, true)
				sameUpdates(t, "offloaded with the device's sums, and on the device", withNorms, dev)
				sameUpdates(t, "offloaded with the host's sums, and on the device", on, dev)
			}
		})
	}
}
