package stages

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestGatherOnce runs the tiny recipe in updates of several micro-batches
// with apply_fsdp2's gather_once on the actor and the ref, against the
// same run without it: the same updates (grad norms, losses, metrics of
// three steps, each from the previous one's weights, and from both
// log-prob stages' values), bit for bit. Each unit is gathered exactly
// once an update by the train stage and once a step by each log-prob
// stage, on each rank; without it the train stage gathers it again for
// the backward and for each micro-batch, and the log-prob stages for each
// micro-batch. With the model on
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
		gathers := map[string]int{} // by stage and unit
		gatherIssued = func(stage string, u *Unit) {
			mu.Lock()
			defer mu.Unlock()
			gathers[stage+" "+u.Name]++
		}
		e := []string{"  steps: 2\n", "  steps: 3\n", "  max_tokens_per_gpu: 768\n", "  max_tokens_per_gpu: 256\n",
			"  recompute: 'layer.index % 2 == 0'\n", "  recompute: 'layer.index % 2 == 0'\n" + policy}
		once := strings.Contains(with, "gather_once: true")
		e = append(e, "      with: {model: actor}\n    - id: shard_ref", "      with: {model: actor"+with+"}\n    - id: shard_ref",
			"      with: {model: ref}\n  step:", fmt.Sprintf("      with: {model: ref, gather_once: %v}\n  step:", once))
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
		{"on the device", "", ", accumulate_grads_on_device: false", dps[len(dps)-1:]},
		{"offloaded", offload, ", accumulate_grads_on_device: false", dps[:1]},
		{"offloaded, grads summed on the device", offload, ", accumulate_grads_on_device: true", dps},
	} {
		for _, dp := range c.dps {
			what := fmt.Sprintf("%s, dp %d", c.name, dp)
			once, n1 := run(c.policy, c.with+", gather_once: true", dp)
			each, n2 := run(c.policy, c.with+", gather_once: false", dp)
			sameUpdates(t, what+": gathered once an update, and for each use", once, each)
			updates := 0
			for _, sr := range once {
				updates += len(sr.Stats.Updates)
			}
			if len(n1) == 0 {
				t.Errorf("%s: no gather counted", what)
			}
			for key, n := range n1 {
				want := steps * dp // a log-prob stage: once a step
				if strings.HasPrefix(key, "train ") {
					want = updates * dp
				}
				if n != want {
					t.Errorf("%s: %s gathered %d times over %d steps of %d updates on %d ranks, want %d", what, key, n, steps, updates, dp, want)
				}
				if n2[key] <= n {
					t.Errorf("%s: %s gathered %d times without gather_once, against %d with: the test shows nothing", what, key, n2[key], n)
				}
			}
		}
	}
}

// TestGatherOnceStaging plans the offloaded tiny job with gather_once and
// checks that each gather's staging buffers (<stage>.h2d.<unit>) end by
// the unit's first use, in the forward, though the kept copy lives on to
// the backward: the staging is read only until the gather completes, which
// the first use awaits.
func TestGatherOnceStaging(t *testing.T) {
	s := tinyVariant(t, "  recompute: 'layer.index % 2 == 0'\n", "  recompute: 'layer.index % 2 == 0'\n  offload: 'model.trainable'\n  offload_optimizer: 'model.trainable'\n",
		"      with: {model: actor}\n    - id: shard_ref", "      with: {model: actor, gather_once: true}\n    - id: shard_ref")
	p, err := Plan(resolveSpec(t, s))
	if err != nil {
		t.Fatal(err)
	}
	first := -1 // the train stage's first backward op: the head's
	for _, o := range p.Ops {
		if o.Stage == "train" && strings.Contains(o.Name, "backward") {
			first = o.Index
			break
		}
	}
	staging := 0
	for _, b := range p.Buffers {
		if b.Stage != "train" || !strings.Contains(b.Name, ".h2d.") {
			continue
		}
		staging++
		if b.End > first {
			t.Errorf("%s lives to op %d (%s), past the first backward op %d", b.Name, b.End, p.Ops[b.End].Name, first)
		}
	}
	if first < 0 || staging == 0 {
		t.Fatalf("first backward op %d, %d staging buffers: the test checks nothing", first, staging)
	}
}
