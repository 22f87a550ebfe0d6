package stages

import (
	"path/filepath"
	"reflect"
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
