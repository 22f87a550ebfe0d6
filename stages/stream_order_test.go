package stages

import (
	"math"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
	"github.com/rlpipe/rlpipe/gpu/lazy"
	"github.com/rlpipe/rlpipe/spec"
)

// TestStreamOrder runs the tiny job on the CPU backend wrapped by
// gpu/lazy, where the side and Down streams' work runs only when something
// waits for it, and holds every step to the plain CPU run's, bit for bit.
// On the plain CPU backend every op completes when issued, so a wait
// missing between two streams cannot show; here a stream that reads what
// another writes without waiting for it reads stale data. One rank: the
// loopback collectives do not go through the backend.
func TestStreamOrder(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	offload := map[string]string{"offload": "true", "offload_optimizer": "model.trainable"}
	for _, tc := range []struct {
		name     string
		policies map[string]string // policy key -> expression
		micro    int               // max_tokens_per_gpu; 0: the recipe's
		edits    []string          // of the recipe's text (variant)
	}{
		// Params stream in on the side stream; grads go out on Down.
		{"offloaded", offload, 0, nil},
		{"offloaded, micro-batches", offload, 256, nil},
		{"offloaded bf16", map[string]string{"offload": "true", "offload_optimizer": "model.trainable", "precision": `"bf16"`}, 0, nil},
		// The ref copies the offloaded actor's params every other step.
		{"offloaded, ref synced", offload, 0, []string{"when: step % 6 == 0", "when: step % 2 == 0"}},
		// The optimizer state alone in pinned memory.
		{"optimizer offloaded", map[string]string{"offload_optimizer": "model.trainable"}, 0, nil},
		{"on device", nil, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mutate := func(s *spec.Spec) {
				s.Train.Steps = 3
				if tc.micro > 0 {
					s.Data.MaxTokensPerGPU = tc.micro
				}
				setPolicies(t, s, tc.policies)
			}
			want := runParsed(t, variant(t, path, tc.edits...), mutate, nil, RunOptions{})
			got := runParsed(t, variant(t, path, tc.edits...), mutate, nil, RunOptions{
				Backend: func(int) (gpu.Backend, error) { return lazy.New(cpu.New()), nil },
			})
			if len(got.steps) != len(want.steps) {
				t.Fatalf("%d steps with lazy streams, %d without", len(got.steps), len(want.steps))
			}
			for i, sr := range got.steps {
				w := want.steps[i]
				if math.Float64bits(sr.Stats.GradNorm) != math.Float64bits(w.Stats.GradNorm) {
					t.Errorf("step %d: grad_norm %.9g with lazy streams, %.9g without", sr.Step, sr.Stats.GradNorm, w.Stats.GradNorm)
				}
				for k, v := range w.Stats.Values {
					if g := sr.Stats.Values[k]; math.Float64bits(g) != math.Float64bits(v) {
						t.Errorf("step %d: %s %.9g with lazy streams, %.9g without", sr.Step, k, g, v)
					}
				}
			}
		})
	}
}

// setPolicies compiles each expression of policies into the spec's policy
// of that key: "offload", "offload_optimizer" or "precision".
func setPolicies(t *testing.T, s *spec.Spec, policies map[string]string) {
	t.Helper()
	for key, src := range policies {
		dst, kind := &s.Policies.Offload, reflect.Bool
		switch key {
		case "offload":
		case "precision":
			dst, kind = &s.Policies.Precision, reflect.String
		case "offload_optimizer":
			dst = &s.Policies.OffloadOptimizer
		default:
			t.Fatalf("setPolicies: no policy %q", key)
		}
		e, err := spec.Compile(src, spec.Pos{File: "test"}, kind)
		if err != nil {
			t.Fatal(err)
		}
		*dst = e
	}
}
