package stages

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestGatherOnce runs the tiny recipe in updates of several micro-batches
// with apply_fsdp2's gather_once, against the same run without it: the
// same updates (grad norms, losses, metrics of three steps, each from the
// previous one's weights), bit for bit, and each unit gathered exactly
// once an update on each rank, where without it the train stage gathers
// it again for the backward and for each micro-batch. With the model on
// the device (on two ranks), offloaded (on one), and offloaded with the
// grads summed on the device as well (on one and two).
func TestGatherOnce(t *testing.T) {
	testGatherOnce(t, RunOptions{}, 1, 2)
}

// testGatherOnce runs TestGatherOnce on base's backend, at the ranks of
// dps each case takes (loopback on the CPU).
func testGatherOnce(t *testing.T, base RunOptions, dps ...int) {
	const steps = 3
	offload := "  offload: 'model.trainable'\n  offload_optimizer: 'model.trainable'\n"
	run := func(policy, with string, dp int) ([]StepResult, map[string]int) {
		var mu sync.Mutex
		gathers := map[string]int{}
		// The train stage's gathers only: the log-prob stages gather for
		// each micro-batch either way.
		gatherIssued = func(stage string, u *Unit) {
			mu.Lock()
			defer mu.Unlock()
			if stage == "train" {
				gathers[u.Name]++
			}
		}
		defer func() { gatherIssued = nil }()
		e := []string{"  steps: 2\n", "  steps: 3\n", "  max_tokens_per_gpu: 768\n", "  max_tokens_per_gpu: 256\n",
			"  recompute: 'layer.index % 2 == 0'\n", "  recompute: 'layer.index % 2 == 0'\n" + policy}
		if with != "" {
			e = append(e, "      with: {model: actor}\n    - id: shard_ref", "      with: {model: actor"+with+"}\n    - id: shard_ref")
		}
		sp := tinyVariant(t, e...)
		sp.Mesh.GPUsPerNode, sp.Mesh.DP = dp, dp
		out := runParsed(t, sp, nil, nil, RunOptions{Backend: base.Backend, Comms: base.Comms})
		if len(out.steps) != steps {
			t.Fatalf("%d steps, want %d", len(out.steps), steps)
		}
		return out.steps, gathers
	}
	for _, c := range []struct {
		name, policy, with string
		dps                []int
	}{
		{"on the device", "", "", dps[len(dps)-1:]},
		{"offloaded", offload, "", dps[:1]},
		{"offloaded, grads summed on the device", offload, ", accumulate_grads_on_device: true", dps},
	} {
		for _, dp := range c.dps {
			what := fmt.Sprintf("%s, dp %d", c.name, dp)
			once, n1 := run(c.policy, c.with+", gather_once: true", dp)
			each, n2 := run(c.policy, c.with, dp)
			sameUpdates(t, what+": gathered once an update, and for each use", once, each)
			updates := 0
			for _, sr := range once {
				updates += len(sr.Stats.Updates)
			}
			if len(n1) == 0 {
				t.Errorf("%s: no gather counted", what)
			}
			for name, n := range n1 {
				if n != updates*dp {
					t.Errorf("%s: %s gathered %d times over %d updates on %d ranks, want once an update", what, name, n, updates, dp)
				}
				if n2[name] <= n {
					t.Errorf("%s: %s gathered %d times without gather_once, against %d with: the test shows nothing", what, name, n2[name], n)
				}
			}
		}
	}
}

// TestGatherOnceRefused checks that validation refuses gather_once for a
// model that no train stage updates, at the key's position.
func TestGatherOnceRefused(t *testing.T) {
	s := variant(t, filepath.Join("..", "examples", "tiny-grpo.yaml"),
		"      with: {model: ref}\n  step:", "      with: {model: ref, gather_once: true}\n  step:")
	_, err := Resolve(s, testGPU, CheckRun)
	if err == nil || !strings.Contains(err.Error(), `gather_once applies to the train stage's updates, and model "ref" is not trained`) ||
		!strings.Contains(err.Error(), "tiny-grpo.yaml:") {
		t.Errorf("resolve: %v, want gather_once refused at its position", err)
	}
}
