package stages

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
	"github.com/rlpipe/rlpipe/gpu/lazy"
	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/spec"
)

// TestStreamOrder runs the tiny job on the CPU backend wrapped by
// gpu/lazy, where the side and Down streams' work runs only when something
// waits for it, and holds every step to the plain CPU run's, bit for bit.
// On the plain CPU backend every op completes when issued, so a wait
// missing between two streams cannot show; here a stream that reads what
// another writes without waiting for it reads stale data. With dp or cp
// above 1 a collective issued on a side stream waits in its queue as well
// (streamComms).
func TestStreamOrder(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	offload := map[string]string{"offload": "true", "offload_optimizer": "model.trainable"}
	for _, tc := range []struct {
		name     string
		policies map[string]string // policy key -> expression
		micro    int               // max_tokens_per_gpu; 0: the recipe's
		edits    []string          // of the recipe's text (variant)
		dp, cp   int               // 0: 1
	}{
		// Params stream in on the side stream; grads go out on Down.
		{"offloaded", offload, 0, nil, 0, 0},
		{"offloaded, micro-batches", offload, 256, nil, 0, 0},
		{"offloaded bf16", map[string]string{"offload": "true", "offload_optimizer": "model.trainable", "precision": `"bf16"`}, 0, nil, 0, 0},
		// The ref copies the offloaded actor's params every other step.
		{"offloaded, ref synced", offload, 0, []string{"when: step % 6 == 0", "when: step % 2 == 0"}, 0, 0},
		// The optimizer state alone in pinned memory.
		{"optimizer offloaded", map[string]string{"offload_optimizer": "model.trainable"}, 0, nil, 0, 0},
		{"on device", nil, 0, nil, 0, 0},
		// The side stream reduce-scatters each unit's grads; the Down
		// stream copies the shards to the host.
		{"offloaded, dp 2", offload, 0, nil, 2, 0},
		// The side stream reduce-scatters while the next unit's backward
		// runs.
		{"overlap_reduce, dp 2", nil, 0, []string{"with: {model: actor}\n    - id: shard_ref", "with: {model: actor, overlap_reduce: true}\n    - id: shard_ref"}, 2, 0},
		{"cp 2", nil, 0, nil, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mutate := func(s *spec.Spec) {
				s.Train.Steps = 3
				if tc.micro > 0 {
					s.Data.MaxTokensPerGPU = tc.micro
				}
				setPolicies(t, s, tc.policies)
				if n := max(tc.dp, 1) * max(tc.cp, 1); n > 1 {
					s.Mesh.GPUsPerNode, s.Mesh.DP, s.Mesh.CP = n, max(tc.dp, 1), max(tc.cp, 1)
				}
			}
			want := runParsed(t, variant(t, path, tc.edits...), mutate, nil, RunOptions{})
			got := runParsed(t, variant(t, path, tc.edits...), mutate, nil, RunOptions{
				Backend: func(int) (gpu.Backend, error) { return lazy.New(cpu.New()), nil },
				Comms:   streamComms,
				CPComms: streamComms,
			})
			sameSteps(t, got, want, "with lazy streams", "without")
		})
	}
}

// sameSteps fails t unless got's steps have want's grad norms and stats,
// bit for bit; gotWhat and wantWhat name the two runs in its messages.
func sameSteps(t *testing.T, got, want runOut, gotWhat, wantWhat string) {
	t.Helper()
	if len(got.steps) != len(want.steps) {
		t.Fatalf("%d steps %s, %d %s", len(got.steps), gotWhat, len(want.steps), wantWhat)
	}
	for i, sr := range got.steps {
		w := want.steps[i]
		if math.Float64bits(sr.Stats.GradNorm) != math.Float64bits(w.Stats.GradNorm) {
			t.Errorf("step %d: grad_norm %.9g %s, %.9g %s", sr.Step, sr.Stats.GradNorm, gotWhat, w.Stats.GradNorm, wantWhat)
		}
		for k, v := range w.Stats.Values {
			if g := sr.Stats.Values[k]; math.Float64bits(g) != math.Float64bits(v) {
				t.Errorf("step %d: %s %.9g %s, %.9g %s", sr.Step, k, g, gotWhat, v, wantWhat)
			}
		}
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

// streamComms returns loopback communicators for the backends (lazy
// ones): a collective issued on a lazy stream waits in its queue as one
// op, which runs, in its turn, over a loopback group of its own (NCCL has a
// communicator per stream); one issued on the default stream runs at once.
func streamComms(bs []gpu.Backend) ([]nccl.Comm, error) {
	def, side := nccl.NewLoopback(len(bs)), nccl.NewLoopback(len(bs))
	cs := make([]nccl.Comm, len(bs))
	for i := range cs {
		cs[i] = streamComm{def: def[i], side: side[i]}
	}
	return cs, nil
}

// streamComm is a rank's communicator of streamComms, issuing on s (nil:
// the default stream).
type streamComm struct {
	def, side nccl.Comm
	s         gpu.Stream
}

func (c streamComm) Rank() int { return c.def.Rank() }
func (c streamComm) Size() int { return c.def.Size() }

func (c streamComm) On(s gpu.Stream) nccl.Comm { return streamComm{def: c.def, side: c.side, s: s} }

func (c streamComm) Close() error { return errors.Join(c.def.Close(), c.side.Close()) }

// Abort passes an error on to both loopback groups, which end the other
// ranks' collectives with it.
func (c streamComm) Abort(err error) {
	for _, g := range []nccl.Comm{c.def, c.side} {
		if a, ok := g.(interface{ Abort(error) }); ok {
			a.Abort(err)
		}
	}
}

// issue runs f on the default group now, or queues it on c's lazy stream
// to run on the stream's group.
func (c streamComm) issue(f func(g nccl.Comm) error) error {
	if s, ok := c.s.(*lazy.Stream); ok {
		return s.Later(func() error { return f(c.side) })
	}
	return f(c.def)
}

func (c streamComm) AllGather(ctx context.Context, dst, src gpu.Tensor) error {
	return c.issue(func(g nccl.Comm) error { return g.AllGather(ctx, dst, src) })
}

func (c streamComm) ReduceScatter(ctx context.Context, dst, src gpu.Tensor, op nccl.Op) error {
	return c.issue(func(g nccl.Comm) error { return g.ReduceScatter(ctx, dst, src, op) })
}

func (c streamComm) AllReduce(ctx context.Context, buf gpu.Tensor, op nccl.Op) error {
	return c.issue(func(g nccl.Comm) error { return g.AllReduce(ctx, buf, op) })
}

func (c streamComm) Broadcast(ctx context.Context, buf gpu.Tensor, root int) error {
	return c.issue(func(g nccl.Comm) error { return g.Broadcast(ctx, buf, root) })
}

func (c streamComm) Barrier(ctx context.Context) error {
	return c.issue(func(g nccl.Comm) error { return g.Barrier(ctx) })
}
