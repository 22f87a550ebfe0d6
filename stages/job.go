package stages

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/spec"
	"go.yaml.in/yaml/v3"
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
}

// Name is the model's key under models:.
func (m *Model) Name() string { return m.Spec.Name }

// Job is a spec whose stages are decoded and validated and whose models are
// resolved. It is what the planner and the executor work from.
type Job struct {
	Spec   *spec.Spec
	GPU    GPU
	Stages map[string]Stage // by stage id
	Models map[string]*Model
	Order  []*spec.Stage // setup stages then step stages, each in dependency order
}

// Resolve decodes and validates every stage of s, loads every model's
// config.json (and safetensors headers when present) and evaluates the
// model-level policies. order lists the stages in execution order (setup
// first). All problems are returned together as spec.Errors.
func Resolve(s *spec.Spec, order []*spec.Stage, gpu GPU) (*Job, error) {
	j := &Job{Spec: s, GPU: gpu, Stages: map[string]Stage{}, Models: map[string]*Model{}, Order: order}
	var errs spec.Errors
	errs = append(errs, j.loadModels()...)
	for _, st := range order {
		stg, e := Decode(st)
		errs = append(errs, e...)
		if stg != nil {
			j.Stages[st.ID] = stg
		}
	}
	if len(errs) == 0 {
		for _, st := range order {
			if stg := j.Stages[st.ID]; stg != nil {
				errs = append(errs, stg.Validate(&ValidateContext{Job: j, Stage: st})...)
			}
		}
	}
	if len(errs) == 0 {
		errs = append(errs, j.modelPolicies()...)
	}
	if err := errs.Err(); err != nil {
		return nil, err
	}
	return j, nil
}

func (j *Job) loadModels() spec.Errors {
	var errs spec.Errors
	for _, sm := range j.Spec.Models {
		if sm.Path == "" {
			continue
		}
		m := &Model{Spec: sm, Dir: sm.Path}
		if _, err := os.Stat(sm.Path); err != nil {
			errs = append(errs, spec.Errorf(sm.Pos, "model %q: checkpoint directory %s: %v", sm.Name, sm.Path, unwrapPathErr(err)))
			continue
		}
		cfg, err := model.LoadConfig(filepath.Join(sm.Path, "config.json"))
		if err != nil {
			errs = append(errs, spec.Errorf(sm.Pos, "model %q: %v", sm.Name, err))
			continue
		}
		m.Config = cfg
		if hasWeights(sm.Path) {
			ck, err := model.OpenCheckpoint(sm.Path)
			if err == nil {
				err = ck.Check(cfg)
			}
			if err != nil {
				errs = append(errs, spec.Errorf(sm.Pos, "model %q: %v", sm.Name, err))
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
	env := &spec.Env{
		Model: spec.ModelEnv{
			Name: m.Name(), Role: m.Spec.Role, Family: string(cfg.Family),
			Params: cfg.NumParams(), ParamBytes: 4 * cfg.NumParams(),
			NumLayers: cfg.NumLayers, HiddenSize: cfg.HiddenSize, VocabSize: cfg.VocabSize,
			Trainable: m.Trainable,
		},
		Mesh: spec.MeshEnv{Nodes: j.Spec.Mesh.Nodes, GPUsPerNode: j.Spec.Mesh.GPUsPerNode, WorldSize: j.Spec.Mesh.WorldSize(), DP: j.Spec.Mesh.DP},
		GPU:  spec.GPUEnv{Name: j.GPU.Name, MemoryBytes: j.GPU.Bytes},
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
	if st != nil {
		env.Stage = spec.StageEnv{ID: st.ID, Kind: st.Uses}
	}
	return env
}

func (j *Job) modelPolicies() spec.Errors {
	var errs spec.Errors
	for _, st := range j.Order {
		if t, ok := j.Stages[st.ID].(*Train); ok {
			if m := j.Models[t.Model]; m != nil {
				m.Trainable = true
			}
		}
	}
	p := j.Spec.Policies
	for _, sm := range j.Spec.Models {
		m := j.Models[sm.Name]
		if m == nil {
			continue
		}
		var err error
		if m.Offload, err = evalBool(p.Offload, j.Env(m, nil, nil), false); err != nil {
			errs = append(errs, spec.Errorf(p.Offload.Pos, "policies.offload for model %q: %v", sm.Name, err))
		}
		if m.OffloadOptimizer, err = evalBool(p.OffloadOptimizer, j.Env(m, nil, nil), false); err != nil {
			errs = append(errs, spec.Errorf(p.OffloadOptimizer.Pos, "policies.offload_optimizer for model %q: %v", sm.Name, err))
		}
	}
	return errs
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
		return "", fmt.Errorf("%s: policies.precision returned %q for %s unit %d of model %q; want \"bf16\" or \"fp32\"", e.Pos, v, u.Kind, u.Index, m.Name())
	}
	return v, nil
}

// Recompute reports whether unit u of model m keeps only its input during the
// forward of stage st and recomputes the rest in backward (activation
// checkpointing), per policies.recompute. Only decoder units recompute.
func (j *Job) Recompute(m *Model, u model.Unit, st *spec.Stage) (bool, error) {
	if u.Kind != model.UnitDecoder {
		return false, nil
	}
	v, err := evalBool(j.Spec.Policies.Recompute, j.Env(m, &u, st), true)
	if err != nil {
		return false, fmt.Errorf("policies.recompute: %w", err)
	}
	return v, nil
}

// ValidateContext is what a stage's Validate sees.
type ValidateContext struct {
	Job   *Job
	Stage *spec.Stage
}

// KeyPos is the position of key in the stage's `with:` block, or of the
// stage's `uses:` when the key is absent.
func (vc *ValidateContext) KeyPos(key string) spec.Pos {
	if w := vc.Stage.With; w != nil && w.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(w.Content); i += 2 {
			if w.Content[i].Value == key {
				return spec.NodePos(vc.Stage.UsesPos.File, w.Content[i+1])
			}
		}
	}
	return vc.Stage.UsesPos
}

// Errorf is an error at the position of key in the stage's `with:` block.
func (vc *ValidateContext) Errorf(key, format string, args ...any) *spec.Error {
	return spec.Errorf(vc.KeyPos(key), "stage %q: %s", vc.Stage.ID, fmt.Sprintf(format, args...))
}

// stagesOfKind returns the ids of the job's stages of the given kind that
// satisfy keep.
func (j *Job) stagesOfKind(kind string, keep func(Stage) bool) []*spec.Stage {
	var out []*spec.Stage
	for _, st := range j.Order {
		if st.Uses == kind && (keep == nil || keep(j.Stages[st.ID])) {
			out = append(out, st)
		}
	}
	return out
}

// CheckRunnable reports what `rlpipe run` needs beyond what `rlpipe plan`
// needs: the weights of every loaded model and the rollout file. It runs
// before anything is allocated, with positions in the spec.
func (j *Job) CheckRunnable() error {
	var errs spec.Errors
	for _, st := range j.stagesOfKind("load_hf", nil) {
		name := j.Stages[st.ID].(*LoadHF).Model
		if m := j.Models[name]; m != nil && m.Checkpoint == nil {
			errs = append(errs, spec.Errorf(m.Spec.Pos, "model %q: %s has config.json but no model.safetensors: rlpipe run needs the weights (rlpipe plan does not)", name, m.Dir))
		}
	}
	if _, err := os.Stat(j.Spec.Data.Rollouts); err != nil {
		errs = append(errs, spec.Errorf(j.Spec.Data.Pos, "data.rollouts: %s: %v", j.Spec.Data.Rollouts, unwrapPathErr(err)))
	}
	return errs.Err()
}
