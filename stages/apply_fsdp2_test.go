package stages

import (
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/rlpipe/rlpipe/spec"
)

// TestCopyOfFromShards runs the embedded default, whose ref is a copy_of
// the actor, against the same recipe with the ref loaded from the actor's
// checkpoint by path, in fp32 and in bf16: the copy reads no bytes (its
// shards are copied from the actor's on the device) and every metric of
// every step, the KL to the ref included, is bitwise the same.
func TestCopyOfFromShards(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	for _, prec := range []string{`"fp32"`, `"bf16"`} {
		t.Run(prec, func(t *testing.T) {
			short := func(s *spec.Spec) {
				s.Train.Steps = 3
				e, err := spec.Compile(prec, spec.Pos{File: "test"}, reflect.String)
				if err != nil {
					t.Fatal(err)
				}
				s.Policies.Precision = e
			}
			run := func(s *spec.Spec) (runOut, int64) {
				var mu sync.Mutex
				var refBytes int64
				opts := RunOptions{Progress: func(ev SetupEvent) {
					if ev.Kind == SetupFinished && ev.Model == "ref" {
						mu.Lock()
						refBytes += ev.Bytes
						mu.Unlock()
					}
				}}
				out := runParsed(t, s, short, nil, opts)
				return out, refBytes
			}
			copied, copiedBytes := run(variant(t, path))
			loaded, loadedBytes := run(variant(t, path, "ref:\n    copy_of: actor", "ref:\n    path: models/tiny-qwen2",
				"    - id: shard_ref\n      uses: apply_fsdp2\n      needs: load\n",
				"    - id: load_ref\n      uses: load_hf\n      with: {model: ref}\n    - id: shard_ref\n      uses: apply_fsdp2\n      needs: load_ref\n"))
			if copiedBytes != 0 || loadedBytes == 0 {
				t.Errorf("bytes read into the ref's shards: %d as a copy (want 0), %d by path (want the checkpoint's)", copiedBytes, loadedBytes)
			}
			if len(copied.steps) != 3 || len(loaded.steps) != 3 {
				t.Fatalf("steps: %d and %d, want 3", len(copied.steps), len(loaded.steps))
			}
			for i := range copied.steps {
				a, b := copied.steps[i].Stats, loaded.steps[i].Stats
				if a.GradNorm != b.GradNorm {
					t.Errorf("step %d: grad norm %v as a copy, %v by path", i+1, a.GradNorm, b.GradNorm)
				}
				if len(a.Values) == 0 || len(a.Values) != len(b.Values) {
					t.Errorf("step %d: %d metrics as a copy, %d by path", i+1, len(a.Values), len(b.Values))
				}
				for k, v := range a.Values {
					if w, ok := b.Values[k]; !ok || v != w {
						t.Errorf("step %d: %s = %v as a copy, %v by path", i+1, k, v, w)
					}
				}
			}
		})
	}
}

// TestPrefetch runs the tiny recipe at dp 2 with the actor's units
// gathered 0, 1 and 2 ahead: the same metrics, the plan equal to the
// arena's high-water, more memory the further ahead, and the gathers
// issued as far ahead as asked, forward and backward.
func TestPrefetch(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-dp2.yaml")
	short := func(s *spec.Spec) { s.Train.Steps = 2 }
	outs := make([]runOut, 3)
	for k := range outs {
		s := variant(t, path, "      with: {model: actor}\n    - id: shard_ref", "      with: {model: actor, gather_once: false, prefetch: "+string(rune('0'+k))+"}\n    - id: shard_ref")
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
