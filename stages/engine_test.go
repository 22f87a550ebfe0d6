package stages

import (
	"context"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
)

type runOut struct {
	p     *plan.Plan
	steps []StepResult // rank 0
	peak  []int64      // per rank: arena high-water
	plan  int64        // the plan's peak
	arena int64        // the plan's device arena
	total int64        // the plan's device total: arena + reserves
}

// runSpec resolves, plans and runs a spec file on the CPU backend.
func runSpec(t *testing.T, path string, mutate func(s *spec.Spec)) runOut {
	t.Helper()
	return runSpecWith(t, path, mutate, RunOptions{})
}

// runSpecWith is runSpec with run options; an AfterStep of opts is called
// after the one that records rank 0's steps.
func runSpecWith(t *testing.T, path string, mutate func(s *spec.Spec), opts RunOptions) runOut {
	t.Helper()
	return runJob(t, path, mutate, nil, opts)
}

// runJob is runSpecWith with mutateJob, when not nil, applied to the
// resolved job (stage parameters that change no port) before it is
// planned.
func runJob(t *testing.T, path string, mutate func(s *spec.Spec), mutateJob func(j *Job), opts RunOptions) runOut {
	t.Helper()
	s, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return runParsed(t, s, mutate, mutateJob, opts)
}

// variant parses the spec at path with each old string of edits (old,
// new, old, new, ...) replaced by its new one, as if the file said so:
// relative paths still resolve against path's directory.
func variant(t *testing.T, path string, edits ...string) *spec.Spec {
	t.Helper()
	s, err := spec.Parse(path, []byte(edit(t, path, readFile(t, path), edits...)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// edit makes the edits, pairs of old and new text, to src (of what),
// each the first occurrence, and fails the test where src lacks one.
func edit(t *testing.T, what, src string, edits ...string) string {
	t.Helper()
	for i := 0; i+1 < len(edits); i += 2 {
		if !strings.Contains(src, edits[i]) {
			t.Fatalf("%s has no %q to replace", what, edits[i])
		}
		src = strings.Replace(src, edits[i], edits[i+1], 1)
	}
	return src
}

// runParsed resolves, plans and runs s; see runJob.
func runParsed(t *testing.T, s *spec.Spec, mutate func(s *spec.Spec), mutateJob func(j *Job), opts RunOptions) runOut {
	t.Helper()
	if mutate != nil {
		mutate(s)
	}
	j := resolveSpec(t, s)
	if mutateJob != nil {
		mutateJob(j)
	}
	p, err := Plan(j)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	out := runOut{p: p, plan: p.PeakBytes, arena: p.DeviceArena, total: p.DeviceTotal()}
	after := opts.AfterStep
	opts.AfterStep = func(r *Rank, sr StepResult) error {
		if r.ID == 0 {
			mu.Lock()
			out.steps = append(out.steps, sr)
			mu.Unlock()
		}
		if after != nil {
			return after(r, sr)
		}
		return nil
	}
	res, err := Run(context.Background(), j, p, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Ranks {
		hw, _ := r.Arena.HighWater()
		out.peak = append(out.peak, hw)
	}
	return out
}

func TestRunTiny(t *testing.T) {
	out := runSpec(t, filepath.Join("..", "examples", "tiny-grpo.yaml"), nil)
	for _, sr := range out.steps {
		t.Logf("step %d: %v grad_norm %.4f lr %.2e tokens %d", sr.Step, sr.Stats.Values, sr.Stats.GradNorm, sr.Stats.LR, sr.Tokens)
	}
	if out.peak[0] != out.plan {
		t.Errorf("arena high-water %d, plan peak %d", out.peak[0], out.plan)
	}
}

// TestTinyImproves checks the embedded default's promise: on the toy task
// the reward-weighted objective rises over the steps.
func TestTinyImproves(t *testing.T) {
	out := runSpec(t, filepath.Join("..", "examples", "tiny-grpo.yaml"), nil)
	first, last := out.steps[0].Stats.Values["adv_logp"], out.steps[len(out.steps)-1].Stats.Values["adv_logp"]
	if !(last > first+0.1) {
		t.Errorf("adv_logp went from %.4f to %.4f; the policy did not learn the toy reward", first, last)
	}
}

// TestRanksAgree runs the tiny job on 1, 2 and 4 loopback ranks: FSDP
// sharding, balancing and reductions must not change the math, and every
// rank's arena high-water mark must equal the plan's peak.
func TestRanksAgree(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	const steps = 4
	var base runOut
	for _, dp := range []int{1, 2, 4} {
		out := runSpec(t, path, func(s *spec.Spec) {
			s.Mesh.GPUsPerNode, s.Mesh.DP = dp, dp
			s.Train.Steps = steps
		})
		for r, hw := range out.peak {
			if hw != out.plan {
				t.Errorf("dp %d rank %d: arena high-water %d, plan peak %d", dp, r, hw, out.plan)
			}
		}
		if dp == 1 {
			base = out
			continue
		}
		for i, sr := range out.steps {
			want := base.steps[i]
			check := func(name string, got, want float64) {
				if d := math.Abs(got - want); d > 1e-4*math.Max(math.Abs(want), 1e-2) {
					t.Errorf("dp %d step %d: %s = %.8g, want %.8g (1 rank)", dp, sr.Step, name, got, want)
				}
			}
			check("grad_norm", sr.Stats.GradNorm, want.Stats.GradNorm)
			for _, k := range []string{"loss", "kl_loss", "entropy_loss", "adv_logp"} {
				check(k, sr.Stats.Values[k], want.Stats.Values[k])
			}
			if sr.Tokens != want.Tokens {
				t.Errorf("dp %d step %d: %d tokens, want %d", dp, sr.Step, sr.Tokens, want.Tokens)
			}
		}
	}
}

// TestPolicyVariants runs the tiny job under the offload and recompute
// policies: offloading moves state to pinned host memory and recomputing
// (whole layers or their element-wise activations) trades memory for
// compute, neither may change the numbers. bf16 compute
// changes them within bf16 tolerance.
func TestPolicyVariants(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	const steps = 3
	short := func(s *spec.Spec) { s.Train.Steps = steps }
	base := runSpec(t, path, short)
	compile := func(t *testing.T, src string, kind reflect.Kind) *spec.Expr {
		e, err := spec.Compile(src, spec.Pos{File: "test"}, kind)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	tests := []struct {
		name   string
		set    func(t *testing.T, p *spec.Policies)
		relTol float64
	}{
		{"offload params and optimizer", func(t *testing.T, p *spec.Policies) {
			p.Offload = compile(t, "true", reflect.Bool)
			p.OffloadOptimizer = compile(t, "model.trainable", reflect.Bool)
		}, 0},
		{"offload optimizer only", func(t *testing.T, p *spec.Policies) {
			p.OffloadOptimizer = compile(t, "model.trainable", reflect.Bool)
		}, 0},
		{"recompute every layer", func(t *testing.T, p *spec.Policies) { p.Recompute = compile(t, "true", reflect.Bool) }, 0},
		{"recompute none", func(t *testing.T, p *spec.Policies) { p.Recompute = compile(t, "false", reflect.Bool) }, 0},
		{"element-wise every layer", func(t *testing.T, p *spec.Policies) {
			p.RecomputeElementwise = compile(t, "true", reflect.Bool)
		}, 0},
		{"element-wise odd layers, the even ones recomputed", func(t *testing.T, p *spec.Policies) {
			p.Recompute = compile(t, "layer.index % 2 == 0", reflect.Bool)
			p.RecomputeElementwise = compile(t, "true", reflect.Bool)
		}, 0},
		{"element-wise, bf16 compute", func(t *testing.T, p *spec.Policies) {
			p.RecomputeElementwise = compile(t, "true", reflect.Bool)
			p.Precision = compile(t, `"bf16"`, reflect.String)
		}, 3e-2},
		{"bf16 compute", func(t *testing.T, p *spec.Policies) { p.Precision = compile(t, `"bf16"`, reflect.String) }, 3e-2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := runSpec(t, path, func(s *spec.Spec) { short(s); tt.set(t, &s.Policies) })
			if out.peak[0] != out.plan {
				t.Errorf("arena high-water %d, plan peak %d", out.peak[0], out.plan)
			}
			for i, sr := range out.steps {
				want := base.steps[i]
				for _, k := range []string{"loss", "kl_loss", "entropy_loss", "adv_logp"} {
					got, w := sr.Stats.Values[k], want.Stats.Values[k]
					if d := math.Abs(got - w); d > tt.relTol*math.Max(math.Abs(w), 1e-2) {
						t.Errorf("step %d: %s = %.8g, want %.8g", sr.Step, k, got, w)
					}
				}
				if d := math.Abs(sr.Stats.GradNorm - want.Stats.GradNorm); d > tt.relTol*want.Stats.GradNorm {
					t.Errorf("step %d: grad_norm = %.8g, want %.8g", sr.Step, sr.Stats.GradNorm, want.Stats.GradNorm)
				}
			}
		})
	}
}

// TestExportRoundTrip loads the tiny checkpoint on 1, 2 and 4 ranks, runs no
// training step and exports it: every tensor must come back exactly, so
// sharding, padding and reassembly lose nothing and the export keeps HF's
// names and layout.
//
// The tiny checkpoint is stored in fp32; copies of it in bf16 and f16 check
// that the shards are loaded from each stored dtype exactly (the device
// converts the raw rows). Two cases export with a small max shard size: the
// tensors come back as exactly from the shards, through the index.
func TestExportRoundTrip(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	dirs := map[string]string{model.F32: ""}
	for _, dt := range []string{model.BF16, model.F16} {
		dirs[dt] = storedAs(t, filepath.Join("..", "examples", "models", "tiny-qwen2"), dt)
	}
	for _, c := range []struct {
		dp    int
		dtype string
		shard int64 // max shard size; 0: the default, one file
	}{{1, model.F32, 0}, {2, model.F32, 100_000}, {4, model.F32, 0}, {1, model.BF16, 40_000}, {4, model.BF16, 0}, {2, model.F16, 0}} {
		dp := c.dp
		s, err := spec.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		s.Mesh.GPUsPerNode, s.Mesh.DP = dp, dp
		if d := dirs[c.dtype]; d != "" {
			s.Models[0].Path = d
		}
		j := resolveSpec(t, s)
		p, err := Plan(j)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(context.Background(), j, p, RunOptions{FirstStep: 1, Steps: -1, Export: "actor"})
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		e, err := ExportHF(j.Models["actor"], dp, res.Export, dir, ExportOptions{DType: "fp32", MaxShardSize: c.shard})
		if err != nil {
			t.Fatal(err)
		}
		got, err := model.OpenCheckpoint(dir)
		if err != nil {
			t.Fatal(err)
		}
		if sharded := got.Index != ""; sharded != (c.shard > 0) || len(got.Files) != len(e.Weights)-btoi(sharded) {
			t.Errorf("dp %d, max shard size %d: %d files (index %q), export says %v", dp, c.shard, len(got.Files), got.Index, e.Weights)
		}
		want := j.Models["actor"].Checkpoint
		if len(got.Names()) != len(want.Names()) {
			t.Fatalf("dp %d: export has %d tensors, the input %d", dp, len(got.Names()), len(want.Names()))
		}
		for _, name := range want.Names() {
			info, _, _ := want.Tensor(name)
			rows := info.Shape[0]
			a, b := make([]float32, info.NumElements()), make([]float32, info.NumElements())
			if err := got.ReadRows(name, 0, rows, a); err != nil {
				t.Fatal(err)
			}
			if err := want.ReadRows(name, 0, rows, b); err != nil {
				t.Fatal(err)
			}
			for i := range a {
				if a[i] != b[i] {
					t.Fatalf("dp %d, %s: %s[%d] = %v after the round trip, want %v", dp, c.dtype, name, i, a[i], b[i])
				}
			}
		}
		got.Close()
	}
}

// storedAs writes a copy of the checkpoint in dir with every tensor stored
// as dtype and returns its directory.
func storedAs(t *testing.T, dir, dtype string) string {
	t.Helper()
	ck, err := model.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	var ts []model.Tensor
	for _, name := range ck.Names() {
		info, _, _ := ck.Tensor(name)
		data := make([]float32, info.NumElements())
		if err := ck.ReadRows(name, 0, info.Shape[0], data); err != nil {
			t.Fatal(err)
		}
		ts = append(ts, model.Tensor{Name: name, DType: dtype, Shape: info.Shape, Data: data})
	}
	cfg, err := model.LoadConfig(filepath.Join(dir, model.ConfigFileName))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if err := model.WriteCheckpoint(out, cfg, ts); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestProfile checks that the profile charges time to op kinds without
// their units and changes no number.
func TestProfile(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	short := func(s *spec.Spec) { s.Train.Steps = 2 }
	base := runSpec(t, path, short)
	prof := runSpecWith(t, path, short, RunOptions{Profile: true})
	p := prof.steps[1].Profile
	for _, k := range []string{"attention backward", "gather", "head log-prob chunks", "grad norm + AdamW", "qkv"} {
		if p[k] <= 0 {
			t.Errorf("no time charged to %q; profile %v", k, p)
		}
	}
	for k := range p {
		if strings.Contains(k, "layer") {
			t.Errorf("profile key %q keeps its unit", k)
		}
	}
	if prof.steps[1].Stats.Values["loss"] != base.steps[1].Stats.Values["loss"] {
		t.Error("profiling changed the loss")
	}
}

// TestNoReshard runs the tiny job with reshard_after_forward false: the
// units gathered in the forward stay until their backward (no re-gather),
// which the plan shows, and the numbers are unchanged.
func TestNoReshard(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	short := func(s *spec.Spec) { s.Train.Steps = 2 }
	base := runSpec(t, path, short)
	out := runJob(t, path, short, func(j *Job) { j.Stages["shard_actor"].(*ApplyFSDP2).ReshardAfterForward = false }, RunOptions{})
	p := out.p
	if b := p.Buffer("train.bwd.gathered.layer0"); b != nil {
		t.Error("a unit is gathered again for its backward without resharding")
	}
	fwd := p.Buffer("train.gathered.layer0")
	bwd := opIndex(t, p, "train", "layer0 norm1 backward")
	if fwd == nil || fwd.End < bwd {
		t.Errorf("layer0's forward gather %+v does not last to its backward (op %d)", fwd, bwd)
	}
	for _, sr := range out.steps {
		if want := base.steps[sr.Step-1].Stats.Values["loss"]; sr.Stats.Values["loss"] != want {
			t.Errorf("step %d: loss %v without resharding, %v with", sr.Step, sr.Stats.Values["loss"], want)
		}
	}
	if out.peak[0] != out.plan {
		t.Errorf("arena high-water %d, plan peak %d", out.peak[0], out.plan)
	}
}

// TestOverlapReduce runs the tiny job at dp 2 with the actor's
// overlap_reduce false, true and auto (the example as written): with it
// each unit's grads and reduction buffers live until the next unit's
// reduction, where the compute stream waits for it (the last one's end
// with it), the numbers are unchanged, and every rank's arena high-water
// is still the plan's peak; auto is the plan's choice of true, with
// true's plan.
func TestOverlapReduce(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-dp2.yaml")
	short := func(s *spec.Spec) { s.Train.Steps = 2 }
	with := func(v string) *spec.Spec {
		return variant(t, path, "      with: {model: actor}\n    - id: shard_ref", "      with: {model: actor, overlap_reduce: "+v+"}\n    - id: shard_ref")
	}
	base := runParsed(t, with("false"), short, nil, RunOptions{})
	out := runParsed(t, with("true"), short, nil, RunOptions{})
	auto := runSpec(t, path, short)
	for _, c := range []struct {
		buf, until string
		p          *plan.Plan
	}{
		{"train.rs.in.head", "reduce-scatter grads layer1", out.p},
		{"train.rs.out.layer1", "reduce-scatter grads layer0", out.p},
		{"train.rs.in.layer0", "reduce-scatter grads embed", out.p},
		{"train.rs.in.embed", "reduce-scatter grads embed", out.p},
		{"train.rs.in.layer1", "reduce-scatter grads layer1", base.p},
	} {
		b := c.p.Buffer(c.buf)
		if want := opIndex(t, c.p, "train", c.until); b == nil || b.End != want {
			t.Errorf("%s: %+v, want it to end at %q (op %d)", c.buf, b, c.until, want)
		}
	}
	if out.plan <= base.plan {
		t.Errorf("plan peak %d with overlap_reduce, %d without: the reductions' buffers live longer", out.plan, base.plan)
	}
	var chose []string
	for _, c := range auto.p.Auto {
		if c.Key == "overlap_reduce" {
			chose = append(chose, c.Subject+" "+c.Value)
		}
	}
	if want := []string{"model actor true"}; !slices.Equal(chose, want) || auto.plan != out.plan {
		t.Errorf("auto: the plan chose overlap_reduce %q (want %q), its peak %d (true's %d)", chose, want, auto.plan, out.plan)
	}
	for _, o := range []runOut{out, auto} {
		for _, sr := range o.steps {
			b := base.steps[sr.Step-1]
			if sr.Stats.Values["loss"] != b.Stats.Values["loss"] || sr.Stats.GradNorm != b.Stats.GradNorm {
				t.Errorf("step %d: loss %v grad norm %v with overlap_reduce, %v %v without", sr.Step,
					sr.Stats.Values["loss"], sr.Stats.GradNorm, b.Stats.Values["loss"], b.Stats.GradNorm)
			}
		}
		for r, hw := range o.peak {
			if hw != o.plan {
				t.Errorf("rank %d: arena high-water %d, plan peak %d", r, hw, o.plan)
			}
		}
	}
}

// TestOverlapReduceOffload checks that validation refuses overlap_reduce
// with an offloaded optimizer, naming the key.
func TestOverlapReduceOffload(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-dp2.yaml")
	s := variant(t, path, "      with: {model: actor}\n    - id: shard_ref", "      with: {model: actor, overlap_reduce: true}\n    - id: shard_ref",
		"policies:\n", "policies:\n  offload_optimizer: 'model.trainable'\n")
	_, err := Resolve(s, testGPU, CheckRun)
	if err == nil || !strings.Contains(err.Error(), "overlap_reduce is not supported with offload_optimizer") {
		t.Fatalf("resolve: %v, want overlap_reduce refused", err)
	}
}

// TestLogProbEntropy checks that a log-prob stage with entropy: true keeps
// its per-token entropies, each within [0, ln V].
func TestLogProbEntropy(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	s := variant(t, path, "uses: actor_logprob\n      needs: pack\n      with: {chunk_tokens: 256}", "uses: actor_logprob\n      needs: pack\n      with: {chunk_tokens: 256, entropy: true}")
	var ent []float32
	var tokens int
	runParsed(t, s, func(s *spec.Spec) { s.Train.Steps = 1 }, nil,
		RunOptions{AfterStep: func(r *Rank, _ StepResult) error {
			if r.ID == 0 {
				ent = r.values["old_logp.entropy"].(*TokenValues).Values
				tokens = r.values["pack.batch"].(*Batch).RespTokens()
			}
			return nil
		}})
	if len(ent) == 0 || len(ent) != tokens {
		t.Fatalf("%d entropies kept for %d response tokens", len(ent), tokens)
	}
	for _, h := range ent {
		// The entropy of a 256-way softmax lies in [0, ln 256].
		if !(h > 0 && h <= 5.546) {
			t.Fatalf("entropy %v outside (0, ln 256]", h)
		}
	}
}

// TestEntropyTempered checks the entropy_tempered option of train: at a
// rollout temperature below 1 the tempered distribution is sharper, so its
// entropy is lower than the untempered one (slime's default).
func TestEntropyTempered(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	entropy := func(tempered bool) float64 {
		out := runJob(t, path, func(s *spec.Spec) { s.Train.Steps, s.Data.Temperature = 1, 0.7 },
			func(j *Job) { j.Stages["train"].(*Train).EntropyTempered = tempered }, RunOptions{})
		return out.steps[0].Stats.Values["entropy_loss"]
	}
	plain, tempered := entropy(false), entropy(true)
	if !(tempered < plain) || tempered <= 0 {
		t.Errorf("entropy at T=0.7: tempered %v, untempered %v; want 0 < tempered < untempered", tempered, plain)
	}
}

// TestExportCheckpoint trains the tiny job for two steps, checkpoints every
// rank's shards, and exports the actor from the checkpoint files alone: the
// result must equal the export from the ranks' memory, on 1 and 2 ranks.
func TestExportCheckpoint(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	for _, dp := range []int{1, 2} {
		dir := t.TempDir()
		var j *Job
		s, err := spec.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		s.Mesh.GPUsPerNode, s.Mesh.DP, s.Train.Steps = dp, dp, 2
		j = resolveSpec(t, s)
		p, err := Plan(j)
		if err != nil {
			t.Fatal(err)
		}
		ckpt := filepath.Join(dir, "ckpt")
		res, err := Run(context.Background(), j, p, RunOptions{Export: "actor", AfterStep: func(r *Rank, sr StepResult) error {
			if sr.Step == 2 {
				return r.SaveShards(ckpt)
			}
			return nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		fromMemory, fromFiles := filepath.Join(dir, "mem"), filepath.Join(dir, "files")
		if _, err := ExportHF(j.Models["actor"], dp, res.Export, fromMemory, ExportOptions{DType: "fp32"}); err != nil {
			t.Fatal(err)
		}
		if _, err := ExportCheckpoint(j, "actor", ckpt, fromFiles, ExportOptions{DType: "fp32"}); err != nil {
			t.Fatal(err)
		}
		a, b := readFile(t, filepath.Join(fromMemory, "model.safetensors")), readFile(t, filepath.Join(fromFiles, "model.safetensors"))
		if a != b {
			t.Errorf("dp %d: the export from the checkpoint differs from the export from memory", dp)
		}
		if _, err := ExportCheckpoint(j, "ref", ckpt, filepath.Join(dir, "ref"), ExportOptions{}); err != nil {
			t.Errorf("dp %d: exporting the frozen ref: %v", dp, err)
		}
	}
}
