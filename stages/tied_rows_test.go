package stages

import (
	"reflect"
	"sync"
	"testing"
)

// TestTiedRows runs the tiny recipe (tied embeddings) on one rank with the
// actor and its optimizer offloaded against the run on the device. With
// one micro-batch an update, the head's grads of the embedding stay staged
// on the device, the embedding's reduction adds its own to them and sends
// the touched rows to host memory (tied_rows.go); with several, the host
// adds as before. Either way the updates (grad norms, losses, metrics of
// two steps, the second from the first's weights) are those of the device
// run, bit for bit; in updates of one micro-batch the device serves the
// embedding's sum of squares with the layers' (the head's, with its tied
// slot, is the host's), and none in the others.
func TestTiedRows(t *testing.T) {
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
			edits := []string{"  max_tokens_per_gpu: 768\n", c.tokens, "  steps: 2\n", "  steps: 2\n"}
			resident := runStep(t, tinyVariant(t, edits...), 1)
			var mu sync.Mutex
			served := 0
			defer func(v bool) { deviceNormsOn, normsServed = v, nil }(deviceNormsOn)
			deviceNormsOn = true
			normsServed = func(n int) {
				mu.Lock()
				served += n
				mu.Unlock()
			}
			off := append(edits, "  recompute: 'layer.index % 2 == 0'\n",
				"  recompute: 'layer.index % 2 == 0'\n  offload: 'model.trainable'\n  offload_optimizer: 'model.trainable'\n")
			offloaded := runStep(t, tinyVariant(t, off...), 1)
			if m := offloaded.job.Models["actor"]; !m.Offload || !m.OffloadOptimizer || !m.Config.TieWordEmbeddings {
				t.Fatal("the actor is not offloaded with tied embeddings: the test checks nothing")
			}
			if len(resident.steps) != steps || len(offloaded.steps) != steps {
				t.Fatalf("steps: %d resident, %d offloaded; want %d", len(resident.steps), len(offloaded.steps), steps)
			}
			updates := 0
			for k, sr := range offloaded.steps {
				updates += len(sr.Stats.Updates)
				if !reflect.DeepEqual(sr.Stats.Updates, resident.steps[k].Stats.Updates) {
					t.Errorf("step %d: offloaded updates %+v, on the device %+v", sr.Step, sr.Stats.Updates, resident.steps[k].Stats.Updates)
				}
			}
			if updates == 0 {
				t.Fatal("no updates")
			}
			if want := c.served * updates; served != want {
				t.Errorf("sums of squares from the device: %d over %d updates, want %d", served, updates, want)
			}
		})
	}
}
