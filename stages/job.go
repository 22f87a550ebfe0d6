package stages

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/runtime"
	"github.com/rlpipe/rlpipe/spec"
)

// GPU is the device every rank of the mesh runs on.
type GPU struct {
	Name   string
	Bytes  int64
	Source string // where the figure came from: "--gpu", "spec", "nvml"
}

// Model is one model of the job with its HF config and the decisions the
// model-level policies made for it.
type Model struct {
	Spec             *spec.Model
	Config           *model.Config
	Dir              string            // checkpoint directory the weights come from
	Checkpoint       *model.Checkpoint // nil when the directory holds no safetensors
	Trainable        bool              // a train stage updates it
	Offload          bool              // sharded params in pinned host memory
	OffloadOptimizer bool              // grads and AdamW state in pinned host memory

	paramsOnce sync.Once
	params     int64 // Config.NumParams, counted once (NumParams)
}

// Name is the model's key under models:.
func (m *Model) Name() string { return m.Spec.Name }

// NumParams returns the model's parameter count. Config.NumParams builds
// the whole inventory; the policies' environment (Env), built for every
// unit of every stage program, asks for it, so it is counted once.
func (m *Model) NumParams() int64 {
	m.paramsOnce.Do(func() { m.params = m.Config.NumParams() })
	return m.params
}

// Job is a spec whose stages are decoded and validated, whose stage graph
// and data edges are built, whose models are resolved and whose rollouts
// are read. It is what the planner and the executor work from.
type Job struct {
	Spec   *spec.Spec
	GPU    GPU
	Graph  *runtime.Graph
	Stages map[string]Stage // by stage id
	Models map[string]*Model
	Order  []*spec.Stage // setup stages then step stages, each in execution order
	// Data is the rollout file, read and checked; nil when no stage reads
	// it, or when the job was resolved for planning and the file is absent.
	Data *Data
	// Prompts is the prompts file, likewise.
	Prompts *PromptData

	check Check
	auto  *autoChoices // what Plan chose where the spec says auto
}

// Check says how much of what a run needs Resolve requires.
type Check int

const (
	// CheckRun requires everything `rlpipe run` needs: the weights of every
	// loaded model and the rollout file.
	CheckRun Check = iota
	// CheckPlan requires what `rlpipe plan` needs: the models' configs.
	// Weights and the rollout file are checked when present.
	CheckPlan
	// CheckRunOwnData is CheckRun without the rollout file: the caller
	// reads its samples and sets Job.Data itself (rlpipe logprobs).
	CheckRunOwnData
	// CheckShape is CheckPlan that reads no data file (prompts or
	// rollouts): the plan of a job of the spec's shape at lengths its
	// files were not written for (rlpipe plan --longest).
	CheckShape
)

// planOnly says whether c needs no weights: CheckPlan or CheckShape.
func (c Check) planOnly() bool { return c == CheckPlan || c == CheckShape }

// Resolve validates s in one pass and returns the job: it decodes every
// stage's parameters, builds the stage graph with its data edges, loads
// every model's config.json and safetensors headers, evaluates every
// policy over every model, FSDP unit and stage, and every `when` over the
// run's steps, validates every stage against the job, and reads and checks
// the rollout file. Every problem found is returned, together, as
// spec.Errors, each at the position of the offending value.
func Resolve(s *spec.Spec, gpu GPU, check Check) (*Job, error) {
	j := &Job{Spec: s, GPU: gpu, Stages: map[string]Stage{}, Models: map[string]*Model{}, check: check}
	var errs spec.Errors
	errs = append(errs, j.loadModels()...)
	for _, st := range append(append([]*spec.Stage(nil), s.Setup...), s.Step...) {
		stg, e := Decode(st)
		errs = append(errs, e...)
		if stg != nil && j.Stages[st.ID] == nil {
			j.Stages[st.ID] = stg
		}
	}
	g, err := runtime.Build(s, flow(s, j.Stages))
	switch {
	case err == nil:
		j.Graph = g
	case !s.DroppedStages():
		// With stages the spec dropped, the graph's complaints (inputs
		// they would have fed) would only echo the spec's errors.
		errs.Append(err)
	}
	j.Order = j.order()
	j.markTrainable()
	errs = append(errs, j.modelPolicies()...)
	errs = append(errs, j.unitPolicies()...)
	data, e := j.readData(check)
	errs = append(errs, e...)
	j.Data = data
	prompts, e := j.readPrompts(check)
	errs = append(errs, e...)
	j.Prompts = prompts
	for _, st := range j.Order {
		if stg := j.Stages[st.ID]; stg != nil {
			errs = append(errs, stg.Validate(&ValidateContext{Job: j, Stage: st, Node: j.node(st.ID)})...)
		}
	}
	if j.Graph != nil {
		errs = append(errs, j.Graph.CheckWhen(s.Train.Steps, func(n *runtime.Node, step int) *spec.Env { return j.StepEnv(n.Stage, step) })...)
	}
	errs = append(errs, j.checkWeightWriters()...)
	errs = append(errs, j.checkWindows()...)
	errs = append(errs, j.checkSleep()...)
	if err := errs.Err(); err != nil {
		return nil, err
	}
	return j, nil
}

// Graph decodes the stages of s and builds their graph with its data
// edges, without reading models or data: what `rlpipe graph` shows. Stage
// decoding and graph problems are returned together as spec.Errors.
func Graph(s *spec.Spec) (*runtime.Graph, error) {
	var errs spec.Errors
	decoded := map[string]Stage{}
	for _, st := range append(append([]*spec.Stage(nil), s.Setup...), s.Step...) {
		stg, e := Decode(st)
		errs = append(errs, e...)
		if stg != nil && decoded[st.ID] == nil {
			decoded[st.ID] = stg
		}
	}
	g, err := runtime.Build(s, flow(s, decoded))
	errs.Append(err)
	if err := errs.Err(); err != nil {
		return nil, err
	}
	return g, nil
}

// order is the graph's execution order, or file order (setup first) when
// the graph could not be built.
func (j *Job) order() []*spec.Stage {
	if j.Graph != nil {
		return j.Graph.Sequence()
	}
	var out []*spec.Stage
	for _, st := range append(append([]*spec.Stage(nil), j.Spec.Setup...), j.Spec.Step...) {
		if j.Stages[st.ID] != nil {
			out = append(out, st)
		}
	}
	return out
}

// node returns the graph node of stage id, or nil without a graph.
func (j *Job) node(id string) *runtime.Node {
	if j.Graph == nil {
		return nil
	}
	return j.Graph.Node(id)
}

func (j *Job) loadModels() spec.Errors {
	var errs spec.Errors
	for _, sm := range j.Spec.Models {
		if sm.Path == "" {
			continue
		}
		at := j.Spec.At("models." + sm.Name + ".path")
		m := &Model{Spec: sm, Dir: sm.Path}
		if _, err := os.Stat(sm.Path); err != nil {
			errs = append(errs, spec.Errorf(at, "model %q: checkpoint directory %s: %v", sm.Name, sm.Path, unwrapPathErr(err)))
			continue
		}
		cfg, err := model.LoadConfig(filepath.Join(sm.Path, "config.json"))
		if err != nil {
			errs = append(errs, spec.Errorf(at, "model %q: %v", sm.Name, err))
			continue
		}
		m.Config = cfg
		if hasWeights(sm.Path) {
			ck, err := model.OpenCheckpoint(sm.Path)
			if err == nil {
				err = ck.Check(cfg)
			}
			if err != nil {
				errs = append(errs, spec.Errorf(at, "model %q: %v", sm.Name, err))
				continue
			}
			m.Checkpoint = ck
		}
		j.Models[sm.Name] = m
	}
	for _, sm := range j.Spec.Models {
		if sm.CopyOf == "" {
			continue
		}
		src, ok := j.Models[sm.CopyOf]
		if !ok {
			continue // the source failed to load; its error is already reported
		}
		j.Models[sm.Name] = &Model{Spec: sm, Config: src.Config, Dir: src.Dir, Checkpoint: src.Checkpoint}
	}
	return errs
}

func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func hasWeights(dir string) bool {
	for _, f := range []string{"model.safetensors", "model.safetensors.index.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return true
		}
	}
	return false
}

// Env returns the expression environment for a model (and optionally one of
// its units) in a stage.
func (j *Job) Env(m *Model, u *model.Unit, st *spec.Stage) *spec.Env {
	cfg := m.Config
	env := j.StepEnv(st, 0)
	env.Model = spec.ModelEnv{
		Name: m.Name(), Role: m.Spec.Role, Family: string(cfg.Family),
		Params: m.NumParams(), ParamBytes: 4 * m.NumParams(),
		NumLayers: cfg.NumLayers, HiddenSize: cfg.HiddenSize, VocabSize: cfg.VocabSize,
		Trainable: m.Trainable,
	}
	if u != nil {
		n := u.NumParams()
		env.Layer = spec.LayerEnv{
			Index: u.Index, Kind: string(u.Kind),
			IsFirst: u.Kind == model.UnitEmbed || (u.Kind == model.UnitDecoder && u.Index == 0),
			IsLast:  u.Kind == model.UnitHead || (u.Kind == model.UnitDecoder && u.Index == cfg.NumLayers-1),
			Params:  n, ParamBytes: 4 * n,
		}
	}
	return env
}

// StepEnv returns the environment a stage's `when` sees at a step (0 during
// setup): the step, the mesh, the GPU and the stage.
func (j *Job) StepEnv(st *spec.Stage, step int) *spec.Env {
	m := j.Spec.Mesh
	env := &spec.Env{Step: step, Mesh: spec.MeshEnv{Nodes: m.Nodes, GPUsPerNode: m.GPUsPerNode, WorldSize: m.WorldSize(), DP: m.DP, CP: m.CPSize()},
		GPU: spec.GPUEnv{Name: j.GPU.Name, MemoryBytes: j.GPU.Bytes}}
	if st != nil {
		env.Stage = spec.StageEnv{ID: st.ID, Kind: st.Uses}
	}
	return env
}

// markTrainable marks the models a train stage updates.
func (j *Job) markTrainable() {
	for _, st := range j.Order {
		if t, ok := j.Stages[st.ID].(*Train); ok {
			if m := j.Models[t.Model]; m != nil {
				m.Trainable = true
			}
		}
	}
}

// modelPolicies evaluates the per-model policies (offload,
// offload_optimizer) for every model.
func (j *Job) modelPolicies() spec.Errors {
	var errs spec.Errors
	p := j.Spec.Policies
	for _, sm := range j.Spec.Models {
		m := j.Models[sm.Name]
		if m == nil {
			continue
		}
		var err error
		if m.Offload, err = evalBool(p.Offload, j.Env(m, nil, nil), false); err != nil {
			errs = append(errs, policyError(p.Offload, "offload", fmt.Sprintf("model %q", sm.Name), err))
		}
		if m.OffloadOptimizer, err = evalBool(p.OffloadOptimizer, j.Env(m, nil, nil), false); err != nil {
			errs = append(errs, policyError(p.OffloadOptimizer, "offload_optimizer", fmt.Sprintf("model %q", sm.Name), err))
		}
	}
	return errs
}

// unitPolicies evaluates the per-unit policies (precision, recompute) for
// every unit of every model in every stage that reads or writes the
// model's weights, as planning and running will: an expression that fails
// for some layer is an error now, not an hour into the run. Each failing
// policy is reported once.
func (j *Job) unitPolicies() spec.Errors {
	var errs spec.Errors
	failed := map[string]bool{}
	for _, sm := range j.Spec.Models {
		m := j.Models[sm.Name]
		if m == nil || m.Config == nil {
			continue
		}
		var using []*spec.Stage
		for _, st := range j.Order {
			if j.touches(st, sm.Name) {
				using = append(using, st)
			}
		}
		for _, u := range m.Config.Units() {
			for _, st := range using {
				if _, err := j.Precision(m, u, st); err != nil && !failed["precision"] {
					failed["precision"] = true
					errs = append(errs, policyError(j.Spec.Policies.Precision, "precision", unitLabel(m, u, st), err))
				}
				if e := j.Spec.Policies.RecomputeElementwise; e != nil && u.Kind == model.UnitDecoder && !failed["recompute_elementwise"] {
					if _, err := e.Bool(j.Env(m, &u, st)); err != nil {
						failed["recompute_elementwise"] = true
						errs = append(errs, policyError(e, "recompute_elementwise", unitLabel(m, u, st), err))
					}
				}
				if j.Spec.Policies.Recompute == nil {
					continue // auto: planning chooses
				}
				if _, err := j.Recompute(m, u, st); err != nil && !failed["recompute"] {
					failed["recompute"] = true
					errs = append(errs, policyError(j.Spec.Policies.Recompute, "recompute", unitLabel(m, u, st), err))
				}
			}
		}
	}
	return errs
}

// touches reports whether stage st reads or writes model name's weights.
func (j *Job) touches(st *spec.Stage, name string) bool {
	stg := j.Stages[st.ID]
	if stg == nil {
		return false
	}
	p := stg.Ports(j.Spec)
	for _, in := range p.In {
		if in.Type == TypeWeights(name) {
			return true
		}
	}
	for _, out := range p.Out {
		if out.Type == TypeWeights(name) {
			return true
		}
	}
	return false
}

func unitLabel(m *Model, u model.Unit, st *spec.Stage) string {
	what := fmt.Sprintf("%s unit", u.Kind)
	if u.Kind == model.UnitDecoder {
		what = fmt.Sprintf("layer %d", u.Index)
	}
	return fmt.Sprintf("%s of model %q in stage %q", what, m.Name(), st.ID)
}

// policyError positions a policy's evaluation error on its expression.
func policyError(e *spec.Expr, key, what string, err error) *spec.Error {
	msg := err.Error()
	pos := spec.Pos{}
	var se *spec.Error
	if errors.As(err, &se) {
		pos, msg = se.Pos, se.Msg
	}
	if e != nil && pos.Line == 0 {
		pos = e.Pos
	}
	return spec.Errorf(pos, "policies.%s for %s: %s", key, what, msg)
}

func evalBool(e *spec.Expr, env *spec.Env, def bool) (bool, error) {
	if e == nil {
		return def, nil
	}
	return e.Bool(env)
}

// Precision returns the compute dtype ("bf16" or "fp32") of unit u of model m
// in stage st, per policies.precision.
func (j *Job) Precision(m *Model, u model.Unit, st *spec.Stage) (string, error) {
	e := j.Spec.Policies.Precision
	if e == nil {
		return "bf16", nil
	}
	v, err := e.String(j.Env(m, &u, st))
	if err != nil {
		return "", err
	}
	if v != "bf16" && v != "fp32" {
		return "", spec.Errorf(e.Pos, "returned %q; want \"bf16\" or \"fp32\"", v)
	}
	return v, nil
}

// Recompute reports whether unit u of model m keeps only its input during the
// forward of stage st and recomputes the rest in backward (activation
// checkpointing), per policies.recompute: its expression, or under auto
// (the default) what planning chose. Only decoder units recompute.
func (j *Job) Recompute(m *Model, u model.Unit, st *spec.Stage) (bool, error) {
	if u.Kind != model.UnitDecoder {
		return false, nil
	}
	if j.Spec.Policies.Recompute == nil {
		return j.recomputeAuto(m, u)
	}
	return j.Spec.Policies.Recompute.Bool(j.Env(m, &u, st))
}

// checkWeightWriters reports a model whose weights more than one step
// stage writes: which update a later reader sees would depend on order.
func (j *Job) checkWeightWriters() spec.Errors {
	if j.Graph == nil {
		return nil
	}
	var errs spec.Errors
	writers := map[string][]*runtime.Node{}
	for _, n := range j.Graph.Order(spec.Step) {
		for _, p := range n.Ports.Out {
			if strings.HasPrefix(p.Type, "weights/") {
				writers[p.Type] = append(writers[p.Type], n)
			}
		}
	}
	for _, n := range j.Graph.Order(spec.Step) {
		for _, p := range n.Ports.Out {
			if w := writers[p.Type]; len(w) > 1 && w[1] == n {
				errs.Addf(n.Stage.UsesPos, "stage %q writes %s, which stage %q writes too in the same step; one stage per step may update a model", n.Stage.ID, p.Type, w[0].Stage.ID)
			}
		}
	}
	return errs
}

// checkWindows reports models with sliding-window attention whose window
// is shorter than data.max_seq_len: rlpipe's attention is full causal,
// which equals sliding-window attention only on sequences that fit the
// window.
func (j *Job) checkWindows() spec.Errors {
	var errs spec.Errors
	for _, sm := range j.Spec.Models {
		m := j.Models[sm.Name]
		if m == nil || m.Config == nil || m.Spec.CopyOf != "" {
			continue
		}
		if w := m.Config.SlidingWindow; w > 0 && j.Spec.Data.MaxSeqLen > w {
			errs.Addf(j.Spec.At("data.max_seq_len"), "data.max_seq_len %d exceeds model %q's sliding_window %d: rlpipe's attention is full causal, which equals sliding-window attention only on sequences of at most %d tokens", j.Spec.Data.MaxSeqLen, sm.Name, w, w)
		}
	}
	return errs
}

// ValidateContext is what a stage's Validate sees.
type ValidateContext struct {
	Job   *Job
	Stage *spec.Stage
	// Node is the stage's graph node, with its data edges; nil when the
	// graph could not be built (its errors are reported).
	Node *runtime.Node
}

// Input returns the data edge feeding the stage's input name, or nil.
func (vc *ValidateContext) Input(name string) *runtime.Edge {
	if vc.Node == nil {
		return nil
	}
	return vc.Node.Input(name)
}

// KeyPos is the position of key's value in the stage's `with:` block, or of
// the stage's `uses:` when the key is absent.
func (vc *ValidateContext) KeyPos(key string) spec.Pos {
	if n := withValue(vc.Stage, key); n != nil {
		return spec.NodePos(vc.Stage.UsesPos.File, n)
	}
	return vc.Stage.UsesPos
}

// Errorf is an error at the position of key in the stage's `with:` block.
func (vc *ValidateContext) Errorf(key, format string, args ...any) *spec.Error {
	return spec.Errorf(vc.KeyPos(key), "stage %q: %s", vc.Stage.ID, fmt.Sprintf(format, args...))
}

// model resolves a model name given under key; a model that failed to load
// is nil with no error (its load error is already reported).
func (vc *ValidateContext) model(key, name string) (*Model, spec.Errors) {
	if name == "" {
		return nil, spec.Errors{vc.Errorf(key, "%s is required", key)}
	}
	var names []string
	for _, sm := range vc.Job.Spec.Models {
		if sm.Name == name {
			return vc.Job.Models[name], nil
		}
		names = append(names, sm.Name)
	}
	if vc.Job.Spec.Bad("models") {
		return nil, nil // the model may be one the spec reported and dropped
	}
	msg := fmt.Sprintf("unknown model %q (models: %v)", name, names)
	if s := spec.Closest(name, names); s != "" {
		msg = fmt.Sprintf("unknown model %q (did you mean %q?)", name, s)
	}
	return nil, spec.Errors{vc.Errorf(key, "%s", msg)}
}

// stagesOfKind returns the job's stages of the given kind that satisfy keep.
func (j *Job) stagesOfKind(kind string, keep func(Stage) bool) []*spec.Stage {
	var out []*spec.Stage
	for _, st := range j.Order {
		if st.Uses == kind && (keep == nil || keep(j.Stages[st.ID])) {
			out = append(out, st)
		}
	}
	return out
}
