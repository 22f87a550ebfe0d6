package stages

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/spec"
)

// TestPrefetch runs the tiny recipe at dp 2 with the actor's units
// gathered 0, 1 and 2 ahead: the same metrics, the plan equal to the
// arena's high-water, more memory the further ahead, and the gathers
// issued as far ahead as asked, forward and backward.
func TestPrefetch(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-dp2.yaml")
	short := func(s *spec.Spec) { s.Train.Steps = 2 }
	outs := make([]runOut, 3)
	for k := range outs {
		s := variant(t, path, "      with: {model: actor}\n    - id: shard_ref", "      with: {model: actor, prefetch: "+string(rune('0'+k))+"}\n    - id: shard_ref")
		outs[k] = runParsed(t, s, short, nil, RunOptions{})
		for r, hw := range outs[k].peak {
			if hw != outs[k].plan {
				t.Errorf("prefetch %d, rank %d: arena high-water %d, plan peak %d", k, r, hw, outs[k].plan)
			}
		}
		for i, sr := range outs[k].steps {
			b := outs[1].steps
			if k == 1 || i >= len(b) {
				continue
			}
			if sr.Stats.GradNorm != b[i].Stats.GradNorm || sr.Stats.Values["loss"] != b[i].Stats.Values["loss"] {
				t.Errorf("prefetch %d, step %d: grad norm %v loss %v, prefetch 1: %v %v", k, sr.Step, sr.Stats.GradNorm, sr.Stats.Values["loss"], b[i].Stats.GradNorm, b[i].Stats.Values["loss"])
			}
		}
	}
	t.Logf("plan peaks at prefetch 0, 1, 2: %d, %d, %d", outs[0].plan, outs[1].plan, outs[2].plan)
	if !(outs[0].plan <= outs[1].plan && outs[1].plan <= outs[2].plan) {
		t.Errorf("plan peaks %d, %d, %d at prefetch 0, 1, 2: not rising", outs[0].plan, outs[1].plan, outs[2].plan)
	}
	// The order of the train stage's first micro-batch: layer1 (unit 2) is
	// gathered before the embedding computes only two ahead; layer0 is
	// gathered for the backward before the head's scatter only two ahead.
	for k, o := range outs {
		fwd := opIndex(t, o.p, "train", "gather layer1") < opIndex(t, o.p, "train", "embed forward")
		bwd := opIndex(t, o.p, "train", "gather layer0 for backward") < opIndex(t, o.p, "train", "head backward scatter")
		if fwd != (k == 2) || bwd != (k == 2) {
			t.Errorf("prefetch %d: layer1 gathered before the embedding %v, layer0 for backward before the head's scatter %v", k, fwd, bwd)
		}
	}
	s := variant(t, path, "      with: {model: actor}\n    - id: shard_ref", "      with: {model: actor, prefetch: 3}\n    - id: shard_ref")
	if _, err := Resolve(s, testGPU, CheckRun); err == nil || !strings.Contains(err.Error(), "prefetch must be 0, 1 or 2, got 3") {
		t.Errorf("prefetch 3: %v", err)
	}
}
