package stages

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rlpipe/rlpipe/runtime/plan"
)

// TestUpdateGradsLifetimes checks when a trained model's device grads
// live: on one rank with one micro-batch an update, each unit's as the
// backward accumulated them (train.grad.<unit>) to the optimizer op, with
// no fp32 copy and no reduction op (rawGrads), or, with RLPIPE_RAW_GRADS=0,
// each unit's fp32 copy from its reduction to the optimizer op; every
// unit's from the update's first op when it may run several, and as a
// persistent host buffer (no stage buffer) with the optimizer state
// offloaded.
func TestUpdateGradsLifetimes(t *testing.T) {
	units := []string{"head", "layer1", "layer0", "embed"}
	oneMicro := []string{"max_tokens_per_gpu: 16", "max_tokens_per_gpu: 32"}
	for _, tc := range []struct {
		name   string
		copied bool // RLPIPE_RAW_GRADS=0
		edits  []string
		check  func(t *testing.T, p *plan.Plan)
	}{
		{"one micro-batch", false, oneMicro, func(t *testing.T, p *plan.Plan) {
			opt := opIndex(t, p, "train", "grad norm + AdamW")
			for _, u := range units {
				if b := p.Buffer("train.grads." + u); b != nil {
					t.Errorf("train.grads.%s = %+v, want none (the grads stay raw)", u, b)
				}
				if b := p.Buffer("train.grad." + u); b == nil || b.Start >= opt || b.End != opt || b.Kind != plan.Grads {
					t.Errorf("train.grad.%s = %+v, want grads live until op %d", u, b, opt)
				}
				for _, o := range p.Ops {
					if o.Name == "reduce-scatter grads "+u {
						t.Errorf("op %q declared for raw grads", o.Name)
					}
				}
			}
		}},
		{"one micro-batch, copied", true, oneMicro, func(t *testing.T, p *plan.Plan) {
			opt := opIndex(t, p, "train", "grad norm + AdamW")
			for _, u := range units {
				b := p.Buffer("train.grads." + u)
				if r := opIndex(t, p, "train", "reduce-scatter grads "+u); b == nil || b.Start != r || b.End != opt {
					t.Errorf("train.grads.%s = %+v, want it live over [%d, %d]", u, b, r, opt)
				}
			}
		}},
		{"several micro-batches", false, nil, func(t *testing.T, p *plan.Plan) {
			from, opt := opIndex(t, p, "train", "begin update"), opIndex(t, p, "train", "grad norm + AdamW")
			for _, u := range units {
				if b := p.Buffer("train.grads." + u); b == nil || b.Start != from || b.End != opt {
					t.Errorf("train.grads.%s = %+v, want it live over [%d, %d]", u, b, from, opt)
				}
			}
		}},
		{"optimizer offloaded", false, []string{"policies:\n", "policies:\n  offload_optimizer: 'model.trainable'\n"}, func(t *testing.T, p *plan.Plan) {
			if b := p.Buffer("actor.grads"); b == nil || !b.Host || b.End != -1 && b.End < len(p.Ops)-1 {
				t.Errorf("actor.grads = %+v, want a persistent host buffer", b)
			}
			for _, u := range units {
				if b := p.Buffer("train.grads." + u); b != nil {
					t.Errorf("train.grads.%s declared with the optimizer state offloaded", u)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer setRawGrads(!tc.copied)()
			s := variant(t, filepath.Join("testdata", "tiny.yaml"), tc.edits...)
			j, err := Resolve(s, testGPU, CheckPlan)
			if err != nil {
				t.Fatal(err)
			}
			p, err := Plan(j)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, p)
			checkInvariants(t, p)
		})
	}
}

// TestUpdateGradsRun runs the tiny job with one micro-batch an update, on
// one and two ranks, with the grads as the update's buffers (the optimizer
// state on the device; on one rank, raw: AdamW reads them where the
// backward accumulated them, and again copied into fp32 with
// RLPIPE_RAW_GRADS=0) and as a persistent host buffer (the optimizer
// state offloaded, AdamW still on the device through staging buffers):
// the same grad norms and the same parameters, bit for bit, and each
// rank's arena high-water mark equal to the plan's peak. Units' grads
// that shared memory with a buffer live at the same time would change
// the first run's numbers.
func TestUpdateGradsRun(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	run := func(t *testing.T, dp int, raw bool, edits ...string) (norms []float64, params []ShardRows) {
		t.Helper()
		defer setRawGrads(raw)()
		s := variant(t, path, append([]string{"max_tokens_per_gpu: 768", "max_tokens_per_gpu: 1536"}, edits...)...)
		s.Train.Steps = 2
		s.Mesh.GPUsPerNode, s.Mesh.DP = dp, dp
		j := resolveSpec(t, s)
		p, err := Plan(j)
		if err != nil {
			t.Fatal(err)
		}
		if len(edits) == 0 {
			// One micro-batch an update: each unit's grads live from its
			// reduction, or on one rank stay raw.
			b, z := p.Buffer("train.grads.layer0"), opIndex(t, p, "train", "begin update")
			if raw && dp == 1 {
				if r := p.Buffer("train.grad.layer0"); b != nil || r == nil || r.End != opIndex(t, p, "train", "grad norm + AdamW") {
					t.Fatalf("train.grads.layer0 = %+v, train.grad.layer0 = %+v: want raw grads to the optimizer op", b, r)
				}
			} else if b == nil || b.Start <= z {
				t.Fatalf("train.grads.layer0 = %+v, want it to start after op %d", b, z)
			}
		}
		res, err := Run(t.Context(), j, p, RunOptions{Export: "actor", AfterStep: func(r *Rank, sr StepResult) error {
			if r.ID == 0 {
				for _, u := range r.Stats.Updates {
					norms = append(norms, u.GradNorm)
				}
			}
			return nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res.Ranks {
			if hw, _ := r.Arena.HighWater(); hw != p.PeakBytes {
				t.Errorf("rank %d: arena high-water %d, plan peak %d", r.ID, hw, p.PeakBytes)
			}
		}
		return norms, res.Export
	}
	for _, dp := range []int{1, 2} {
		t.Run(fmt.Sprintf("dp %d", dp), func(t *testing.T) {
			n1, p1 := run(t, dp, true)
			n2, p2 := run(t, dp, true, "policies:\n", "policies:\n  offload_optimizer: 'model.trainable'\n")
			n3, p3 := run(t, dp, false)
			for _, c := range []struct {
				name  string
				norms []float64
				rows  []ShardRows
			}{{"persistent ones", n2, p2}, {"the update's copied into fp32", n3, p3}} {
				if len(n1) == 0 || !slices.Equal(n1, c.norms) {
					t.Errorf("grad norms %v with the update's grads, %v with %s", n1, c.norms, c.name)
				}
				if len(p1) != dp || len(c.rows) != dp {
					t.Fatalf("exported %d and %d ranks' rows, want %d", len(p1), len(c.rows), dp)
				}
				for r := range p1 {
					for name, w := range c.rows[r] {
						if g := p1[r][name]; !slices.Equal(g, w) {
							t.Errorf("rank %d: %s differs between the update's grads and %s", r, name, c.name)
						}
					}
				}
			}
		})
	}
}

// setRawGrads sets rawGradsOn (RLPIPE_RAW_GRADS) and returns a func that
// restores it.
func setRawGrads(on bool) func() {
	was := rawGradsOn
	rawGradsOn = on
	return func() { rawGradsOn = was }
}
