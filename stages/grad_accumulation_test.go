package stages

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestGradAccumulation runs the tiny recipe in updates of several
// micro-batches with the actor and its optimizer offloaded, its grads
// summed on the device (apply_fsdp2's accumulate_grads_on_device), against
// the same run with the later micro-batches' grads added on the host and
// against the run on the device: the same updates (grad norms, losses,
// metrics of three steps, each from the previous one's weights), bit for
// bit. With gradient clipping on one rank; without it (where each unit's
// host AdamW starts as its sums reach the host) on two; and with the
// params on the device (only the optimizer offloaded) on one.
func TestGradAccumulation(t *testing.T) { testGradAccumulation(t, RunOptions{}, true, 1, 2) }

// testGradAccumulation runs TestGradAccumulation on base's backend, with
// the fewest of dps ranks and, without clipping, the most (loopback on the
// CPU), against the run on the device if resident is set.
func testGradAccumulation(t *testing.T, base RunOptions, resident bool, dps ...int) {
	const steps = 3
	edits := []string{"  steps: 2\n", "  steps: 3\n", "  max_tokens_per_gpu: 768\n", "  max_tokens_per_gpu: 256\n", "  recompute: 'layer.index % 2 == 0'\n", "  recompute: 'layer.index % 2 == 0'\n"}
	offload := "  offload: 'model.trainable'\n  offload_optimizer: 'model.trainable'\n"
	onlyOpt := "  offload_optimizer: 'model.trainable'\n"
	// Both options written: neither is left to planning's auto choice.
	with := func(acc bool) []string {
		return []string{"      with: {model: actor}\n    - id: shard_ref", fmt.Sprintf("      with: {model: actor, accumulate_grads_on_device: %v, gather_once: false}\n    - id: shard_ref", acc)}
	}
	run := func(policy, clip string, acc bool, dp int) ([]StepResult, int, int) {
		var mu sync.Mutex
		sums, last := 0, 0
		gradAccumulated = func(_ *Unit, l bool) {
			mu.Lock()
			defer mu.Unlock()
			sums++
			if l {
				last++
			}
		}
		defer func() { gradAccumulated = nil }()
		e := append([]string(nil), edits...)
		e[5] += policy
		e = append(e, "  grad_clip: 1.0\n", "  grad_clip: "+clip+"\n")
		e = append(e, with(acc)...)
		sp := tinyVariant(t, e...)
		sp.Mesh.GPUsPerNode, sp.Mesh.DP = dp, dp
		out := runParsed(t, sp, nil, nil, RunOptions{Backend: base.Backend, Comms: base.Comms})
		if len(out.steps) != steps {
			t.Fatalf("%q, grad_clip %s, dp %d: %d steps, want %d", policy, clip, dp, len(out.steps), steps)
		}
		return out.steps, sums, last
	}
	first, last := dps[:1], dps[len(dps)-1:]
	for _, c := range []struct {
		policy string
		clip   string
		dps    []int
	}{
		{offload, "1.0", first},
		{offload, "0", last}, // early AdamW
		{onlyOpt, "1.0", first},
	} {
		for _, dp := range c.dps {
			what := fmt.Sprintf("dp %d, grad_clip %s, %s", dp, c.clip, strings.TrimSpace(strings.ReplaceAll(c.policy, "\n", ";")))
			acc, sums, last := run(c.policy, c.clip, true, dp)
			// Updates of several micro-batches: some sums are not the last.
			if sums == 0 || last == 0 || last == sums {
				t.Errorf("%s: %d reductions summed into the device's grads, %d of them in a last micro-batch", what, sums, last)
			}
			host, n, _ := run(c.policy, c.clip, false, dp)
			if n != 0 {
				t.Errorf("%s: %d reductions summed on the device without the option", what, n)
			}
			sameUpdates(t, what+": summed on the device and on the host", acc, host)
			if resident {
				dev, _, _ := run("", c.clip, false, dp)
				sameUpdates(t, what+": summed on the device, and the run on the device", acc, dev)
			}
		}
	}
}

// TestGradAccumulationRefused checks that validation refuses
// accumulate_grads_on_device for a model whose optimizer state stays on
// the device, and for a frozen model, at the key's position.
func TestGradAccumulationRefused(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	for _, c := range []struct{ name, old, new string }{
		{"trained, optimizer on the device", "      with: {model: actor}\n    - id: shard_ref", "      with: {model: actor, accumulate_grads_on_device: true}\n    - id: shard_ref"},
		{"frozen", "      with: {model: ref}\n  step:", "      with: {model: ref, accumulate_grads_on_device: true}\n  step:"},
	} {
		s := variant(t, path, "policies:\n", "policies:\n  offload: 'model.trainable'\n", c.old, c.new)
		_, err := Resolve(s, testGPU, CheckRun)
		if err == nil || !strings.Contains(err.Error(), "accumulate_grads_on_device needs a trained model whose optimizer state is offloaded") ||
			!strings.Contains(err.Error(), "tiny-grpo.yaml:") {
			t.Errorf("%s: resolve: %v, want accumulate_grads_on_device refused at its position", c.name, err)
		}
	}
}
