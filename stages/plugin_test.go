package stages_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/runtime"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
)

// probe is a stage plugin written against the exported API only: it plans
// one device buffer, and at run time enters its op, writes the buffer and
// reads it back.
type probe struct {
	Values int `yaml:"values"`
	seen   []float32
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
		in[i] = float32(rc.Rank.Step*100 + i)
	}
	if err := rc.Rank.B.Upload(t, in); err != nil {
		return err
	}
	out := make([]float32, s.Values)
	if err := rc.Rank.B.Download(out, t); err != nil {
		return err
	}
	s.seen = append(s.seen, out[s.Values-1])
	return nil
}

func init() {
	stages.Register(stages.Kind{Name: "test_probe", Phase: spec.Step, Doc: "test plugin",
		New: func() stages.Stage { return &probe{Values: 4} }})
}

// TestPluginStage runs a plugin stage inside the tiny job: it is planned
// with its buffer, runs every step on its planned op, and its with: block
// is decoded over its defaults.
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
    - {id: shard, uses: apply_fsdp2, needs: load, with: {model: actor}}
  step:
    - {id: pack, uses: pack}
    - {id: train, uses: train, needs: pack}
    - {id: probe, uses: test_probe, needs: train, with: {values: 8}}
`))
	if err != nil {
		t.Fatal(err)
	}
	g, err := runtime.NewGraph(s)
	if err != nil {
		t.Fatal(err)
	}
	j, err := stages.Resolve(s, g.Sequence(), stages.GPU{Name: "cpu", Bytes: 1 << 34})
	if err != nil {
		t.Fatal(err)
	}
	p, err := stages.Plan(j)
	if err != nil {
		t.Fatal(err)
	}
	if b := p.Buffer("probe.buf"); b == nil || b.Bytes != plan.AlignUp(4*8) {
		t.Fatalf("plugin buffer = %+v, want %d bytes", b, plan.AlignUp(4*8))
	}
	data, err := stages.ReadData(j)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stages.Run(context.Background(), j, g, p, data, stages.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	pr := j.Stages["probe"].(*probe)
	if pr.Values != 8 || len(pr.seen) != 2 || pr.seen[0] != 107 || pr.seen[1] != 207 {
		t.Errorf("plugin ran with values %d and saw %v; want 8 and [107 207]", pr.Values, pr.seen)
	}
}
