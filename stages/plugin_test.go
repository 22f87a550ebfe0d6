package stages_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
)

// probe is a stage plugin written against the exported API only: it
// reads pack's batch through its "batch" input, plans one device buffer,
// and at run time enters its op, writes the batch's response-token count
// into the buffer, reads it back and writes it to its "tokens" output.
type probe struct {
	Values int `yaml:"values"`
}

func (s *probe) Ports(*spec.Spec) stages.Ports {
	return stages.Ports{
		In:  []stages.Input{{Port: stages.Port{Name: "batch", Type: stages.TypeBatch}}},
		Out: []stages.Port{{Name: "tokens", Type: "test/tokens"}},
	}
}

func (s *probe) Validate(vc *stages.ValidateContext) spec.Errors {
	if s.Values < 1 {
		return spec.Errors{vc.Errorf("values", "values must be at least 1")}
	}
	return nil
}

func (s *probe) Plan(pc *stages.PlanContext) error {
	op := pc.B.Op("probe")
	pc.B.Alloc(pc.Stage.ID+".buf", plan.IO, int64(4*s.Values), op, op)
	return nil
}

func (s *probe) Run(_ context.Context, rc *stages.RunContext) error {
	b, ok, err := stages.In[*stages.Batch](rc, "batch")
	if err != nil || !ok {
		return fmt.Errorf("probe: batch: %v (fed: %v)", err, ok)
	}
	a := rc.Rank.Arena
	if err := a.EnterNamed("probe"); err != nil {
		return err
	}
	t, err := a.Tensor(rc.Stage.ID+".buf", gpu.F32, s.Values)
	if err != nil {
		return err
	}
	in := make([]float32, s.Values)
	for i := range in {
		in[i] = float32(b.RespTokens() + i)
	}
	if err := rc.Rank.B.Upload(t, in); err != nil {
		return err
	}
	out := make([]float32, s.Values)
	if err := rc.Rank.B.Download(out, t); err != nil {
		return err
	}
	return rc.Out("tokens", int(out[0]))
}

// sink records, per step, the value its "tokens" input holds.
type sink struct {
	seen []int
}

func (s *sink) Ports(*spec.Spec) stages.Ports {
	return stages.Ports{In: []stages.Input{{Port: stages.Port{Name: "tokens", Type: "test/tokens"}}}}
}

func (s *sink) Validate(*stages.ValidateContext) spec.Errors { return nil }
func (s *sink) Plan(*stages.PlanContext) error               { return nil }

func (s *sink) Run(_ context.Context, rc *stages.RunContext) error {
	n, _, err := stages.In[int](rc, "tokens")
	if err != nil {
		return err
	}
	if rc.Rank.ID == 0 {
		s.seen = append(s.seen, n)
	}
	return nil
}

func init() {
	stages.Register(stages.Kind{Name: "test_probe", Phase: spec.Step, Doc: "test plugin",
		New: func() stages.Stage { return &probe{Values: 4} }})
	stages.Register(stages.Kind{Name: "test_sink", Phase: spec.Step, Doc: "test plugin",
		New: func() stages.Stage { return &sink{} }})
}

// TestPluginStage runs two plugin stages inside the tiny job: the probe
// reads pack's output and writes its own, the sink reads the probe's, both
// through the port API; the probe is planned with its buffer and runs
// every step on its planned op, and its with: block is decoded over its
// defaults. Listed before the stages they read, they run after them.
func TestPluginStage(t *testing.T) {
	s, err := spec.Parse(filepath.Join("..", "examples", "x.yaml"), []byte(`version: 1
name: plugin
models:
  actor: {path: models/tiny-qwen2}
data: {rollouts: data/tiny-rollouts.jsonl, global_batch_size: 64, samples_per_prompt: 8, max_tokens_per_gpu: 768, max_seq_len: 24}
train: {steps: 2}
stages:
  setup:
    - {id: load, uses: load_hf, with: {model: actor}}
    - {id: shard, uses: apply_fsdp2, with: {model: actor}}
  step:
    - {id: sink, uses: test_sink}
    - {id: probe, uses: test_probe, with: {values: 8}}
    - {id: train, uses: train}
    - {id: pack, uses: pack}
`))
	if err != nil {
		t.Fatal(err)
	}
	j, err := stages.Resolve(s, stages.GPU{Name: "cpu", Bytes: 1 << 34}, stages.CheckRun)
	if err != nil {
		t.Fatal(err)
	}
	at := map[string]int{}
	var order []string
	for i, n := range j.Graph.Order(spec.Step) {
		at[n.Stage.ID] = i
		order = append(order, n.Stage.ID)
	}
	if !(at["pack"] < at["probe"] && at["probe"] < at["sink"] && at["pack"] < at["train"]) {
		t.Fatalf("step order %v: a reader runs before what it reads", order)
	}
	p, err := stages.Plan(j)
	if err != nil {
		t.Fatal(err)
	}
	if b := p.Buffer("probe.buf"); b == nil || b.Bytes != plan.AlignUp(4*8) {
		t.Fatalf("plugin buffer = %+v, want %d bytes", b, plan.AlignUp(4*8))
	}
	if _, err := stages.Run(context.Background(), j, p, stages.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	// Each step's batch is 64 samples of the rollout file; the probe adds
	// 0 to the count it writes.
	var want []int
	for step := 1; step <= 2; step++ {
		n := 0
		for _, sm := range j.Data.Step(step).Samples {
			n += sm.ResponseLength
		}
		want = append(want, n)
	}
	pr := j.Stages["probe"].(*probe)
	got := j.Stages["sink"].(*sink).seen
	if pr.Values != 8 || len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("plugin ran with values %d and the sink saw %v; want 8 and %v", pr.Values, got, want)
	}
}
