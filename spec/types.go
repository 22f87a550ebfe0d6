// Package spec holds the rlpipe job spec (version 1): its typed form, the YAML
// loader that keeps the position of every value, and the policy expressions.
package spec

import (
	"fmt"

	"github.com/expr-lang/expr/vm"
	"go.yaml.in/yaml/v3"
)

// Pos is a position in a spec file. Line and Col are 1-based.
type Pos struct {
	File string
	Line int
	Col  int
}

// String formats the position as file:line:col.
func (p Pos) String() string { return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Col) }

// Phase says when a stage runs: setup stages run once before the first step,
// step stages run on every training step.
type Phase string

// The two phases of a pipeline.
const (
	Setup Phase = "setup"
	Step  Phase = "step"
)

// Spec is a job spec: a valid one when Parse returns no error, a partial one
// when Parse returns it together with errors.
//
// Every field of a partial spec holds either a value that passed every check
// of its key or the key's default; never a value that failed a check:
//
//   - A required key that is missing or invalid leaves its field at zero:
//     Version 0, Name "", Data.GlobalBatchSize, Data.MaxTokensPerGPU and
//     Train.Steps 0. A consumer must read these zeros as "reported by the
//     spec" and skip the checks that need the value. The zeros keep the
//     consumer's arithmetic safe: UpdatesPerStep and TotalUpdates are 0,
//     and no divisor (Mesh.DP, Data.SamplesPerPrompt, Train.PPOEpochs) is.
//   - A key with a default whose value is invalid holds its default, and
//     so does a section that is not a mapping. Computed defaults are
//     computed from the partial values: Data.RolloutBatchSize is
//     GlobalBatchSize / SamplesPerPrompt (0 when GlobalBatchSize is 0),
//     Data.MaxSeqLen is MaxSeqFits(MaxTokensPerGPU, CP) (perhaps 0), Train.DecaySteps is
//     TotalUpdates() (perhaps 0).
//   - Cross-field checks leave their fields consistent: the field the error
//     is reported at takes its default or zero, and so does any field whose
//     check against a reset field no longer holds. Mesh.CP divides
//     Nodes × GPUsPerNode and Mesh.DP is always that over Mesh.CP; a
//     non-zero GlobalBatchSize is a multiple of
//     SamplesPerPrompt and of Mesh.DP; RolloutSamples() is at most
//     MaxRolloutSamples and, when GlobalBatchSize is not 0, a multiple of
//     it; SeqRows(MaxSeqLen, CP) is at most MaxTokensPerGPU unless that is 0;
//     TotalUpdates() is at most MaxUpdates; MinLR and WarmupInitLR are at
//     most LR; ShuffleGroups implies Shuffle; with a linear or cosine decay,
//     a non-zero DecaySteps exceeds WarmupSteps.
//   - Models with an invalid name are dropped; the others are kept. A
//     model's Role is "" when it is missing or invalid or a second "actor",
//     so at most one model is the actor (perhaps none). Path and CopyOf are
//     "" when invalid, both of them when both are written; a non-empty
//     CopyOf names another model of Models whose CopyOf is "".
//   - An expression that failed to compile is nil, and so is a precision
//     policy that can return an unknown precision.
//   - Only the stages with a valid id that no earlier stage has, and a
//     non-empty uses, are kept, so that their other problems can be
//     reported. Their invalid needs, with and when are absent, and so are
//     their needs that name a dropped stage.
//
// Bad tells which sections had errors or hold values reset because of them.
type Spec struct {
	Version  int
	Name     string
	File     string // path the spec was read from
	Dir      string // directory of File; relative paths in the spec resolve against it
	Models   []*Model
	Mesh     Mesh
	Data     Data
	Train    Train
	Policies Policies
	Setup    []*Stage // stages.setup, in file order
	Step     []*Stage // stages.step, in file order

	// positions maps the dotted path of every key of the file to the
	// position of its value; see At.
	positions map[string]Pos
	// bad holds the top-level keys of a partial spec that are bad; see Bad.
	bad map[string]bool
	// droppedStages is set when the partial spec dropped a stage; see
	// DroppedStages.
	droppedStages bool
}

// UpdatesPerStep is the number of optimizer updates of one training step:
// ppo_epochs passes over the rollout batch of B = Data.RolloutSamples()
// samples, each pass cut into B / global_batch_size mini-batches of one
// update each. It is 0 when the global batch size is not set.
func (s *Spec) UpdatesPerStep() int {
	if s.Data.GlobalBatchSize <= 0 {
		return 0
	}
	return s.Train.PPOEpochs * (s.Data.RolloutSamples() / s.Data.GlobalBatchSize)
}

// TotalUpdates is the number of optimizer updates of the whole run:
// train.steps × UpdatesPerStep(). The learning-rate schedule counts these.
func (s *Spec) TotalUpdates() int64 {
	return int64(s.Train.Steps) * int64(s.UpdatesPerStep())
}

// Model is one entry of `models:`.
type Model struct {
	Name   string // key under models:
	Role   string // "actor" or "ref"; "" only in a partial spec
	Path   string // HF checkpoint directory, resolved against Spec.Dir; empty when CopyOf is set
	CopyOf string // name of the model this one starts as a copy of
	Pos    Pos
}

// Mesh is the device mesh.
type Mesh struct {
	Nodes       int    // default 1
	GPUsPerNode int    // default 1
	DP          int    // data-parallel size; default Nodes*GPUsPerNode/CP; DP*CP must equal the world (even in a partial spec)
	CP          int    // context-parallel size: each sequence is split over CP ranks; default 1
	GPU         string // memory preset name or byte count; empty means "ask NVML or --gpu"
	HostMemory  int64  // a node's RAM in bytes, for the plan's host check; 0: not given
	Pos         Pos
}

// WorldSize is the number of ranks in the mesh: dp × cp. FSDP shards
// every model over all of them.
func (m Mesh) WorldSize() int { return m.Nodes * m.GPUsPerNode }

// CPSize is mesh.cp, at least 1.
func (m Mesh) CPSize() int { return max(m.CP, 1) }

// SeqRows is the number of rows a sequence of n tokens puts on each of cp
// context-parallel ranks: n itself at cp 1; otherwise the sequence is
// padded to a multiple of 2·cp and each rank holds two of its 2·cp chunks
// (zigzag, see model.ZigzagLayout).
func SeqRows(n, cp int) int {
	if cp <= 1 {
		return n
	}
	return 2 * ((n + 2*cp - 1) / (2 * cp))
}

// MaxSeqFits is the longest sequence whose rows on each of cp ranks fit
// in a micro-batch of maxTokens rows (SeqRows(n, cp) ≤ maxTokens).
func MaxSeqFits(maxTokens, cp int) int {
	if cp <= 1 {
		return maxTokens
	}
	return cp * (maxTokens - maxTokens%2)
}

// Data describes the rollout data and how it is batched.
type Data struct {
	// Rollouts is the JSONL file of rollouts a pack stage reads when no
	// stage generates them; Prompts the JSONL file of prompts a generate
	// stage samples from. Paths resolve against Spec.Dir; "" when absent
	// (the stages that need one say so).
	Rollouts         string
	Prompts          string
	GlobalBatchSize  int     // samples per optimizer update (one mini-batch) over all dp ranks; 0 only in a partial spec
	SamplesPerPrompt int     // n, the GRPO group size
	RolloutBatchSize int     // prompt groups per training step; default GlobalBatchSize / SamplesPerPrompt
	MaxTokensPerGPU  int     // upper bound of one packed micro-batch; 0 only in a partial spec
	MaxSeqLen        int     // longest sample (prompt + response) accepted
	Temperature      float64 // rollout temperature; default 1
	Pos              Pos
}

// RolloutSamples is B, the number of samples one training step consumes:
// rollout_batch_size × samples_per_prompt. It is a multiple of
// GlobalBatchSize.
func (d Data) RolloutSamples() int { return d.RolloutBatchSize * d.SamplesPerPrompt }

// Train holds the training loop and optimizer hyper-parameters.
type Train struct {
	Steps           int     // training steps; each consumes one rollout batch; 0 only in a partial spec
	PPOEpochs       int     // passes over the rollout batch per step; default 1
	Shuffle         bool    // visit the samples of each epoch in a seeded random order; default false
	ShuffleGroups   bool    // when shuffling, keep each prompt group's samples together; default false
	Seed            int64   // seed of every random choice of the run; default 1
	LR              float64 // default 1e-6
	MinLR           float64 // default 0
	Betas           [2]float64
	Eps             float64 // default 1e-8
	WeightDecay     float64 // default 0
	GradClip        float64 // global L2 norm; default 1.0; 0 disables
	WarmupSteps     int     // optimizer updates of linear warmup; default 0
	WarmupInitLR    float64 // default 0
	Decay           string  // "constant" (default), "linear", "cosine"
	DecaySteps      int     // optimizer updates until the decay reaches MinLR; default Spec.TotalUpdates() (0 when that is 0, in a partial spec)
	CheckpointEvery int     // steps between checkpoints; 0 = only at the end
	// CheckpointAsync copies the shards into a pinned host snapshot at a
	// checkpoint and writes the files in the background while training
	// goes on; default false.
	CheckpointAsync bool
	Pos             Pos
}

// Policies are per-model / per-layer decisions written as expressions.
// A nil expression means the default.
type Policies struct {
	Offload          *Expr // bool, per model: sharded params in pinned host memory. default false
	OffloadOptimizer *Expr // bool, per model: grads and AdamW state in pinned host memory. default false
	Precision        *Expr // string "bf16"|"fp32", per layer: compute dtype of the unit. default "bf16"
	Recompute        *Expr // bool, per layer: activation checkpointing of the unit. nil (written or by default): auto, the fewest layers that fit, chosen by planning
	// RecomputeElementwise is bool, per layer: a decoder layer that does
	// not recompute keeps no element-wise activations (its norm outputs
	// and SwiGLU output) and recomputes them in backward. nil (written or
	// by default): auto, chosen by planning under recompute auto, else
	// false.
	RecomputeElementwise *Expr
}

// Stage is one entry of stages.setup or stages.step.
type Stage struct {
	ID      string
	Uses    string     // stage kind, e.g. "load_hf"
	Needs   []Ref      // ids this stage runs after
	With    *yaml.Node // kind-specific parameters, decoded by the stage registry; nil when absent
	When    *Expr      // bool; nil means always
	Phase   Phase
	Pos     Pos // position of the entry
	UsesPos Pos
}

// Ref is a reference to another entry by name, with the position of the reference.
type Ref struct {
	Name string
	Pos  Pos
}

// Expr is a compiled policy or `when` expression.
type Expr struct {
	Src     string
	Pos     Pos // position of the first character of the expression source
	Program *vm.Program
}

// Env is the environment every expression is compiled and evaluated against.
// Fields a context does not define hold their zero values.
type Env struct {
	Model ModelEnv `expr:"model"`
	Layer LayerEnv `expr:"layer"`
	Mesh  MeshEnv  `expr:"mesh"`
	GPU   GPUEnv   `expr:"gpu"`
	Stage StageEnv `expr:"stage"`
	Step  int      `expr:"step"`
}

// ModelEnv describes a model to an expression.
type ModelEnv struct {
	Name       string `expr:"name"`
	Role       string `expr:"role"`   // "actor" | "ref"
	Family     string `expr:"family"` // "llama" | "qwen2" | "qwen3" | "mistral"
	Params     int64  `expr:"params"`
	ParamBytes int64  `expr:"param_bytes"` // fp32 master bytes of the whole model
	NumLayers  int    `expr:"num_layers"`
	HiddenSize int    `expr:"hidden_size"`
	VocabSize  int    `expr:"vocab_size"`
	Trainable  bool   `expr:"trainable"`
}

// LayerEnv describes one FSDP unit to an expression.
type LayerEnv struct {
	Index      int    `expr:"index"` // decoder layer index; -1 for embed, NumLayers for head
	Kind       string `expr:"kind"`  // "embed" | "decoder" | "head"
	IsFirst    bool   `expr:"is_first"`
	IsLast     bool   `expr:"is_last"`
	Params     int64  `expr:"params"`
	ParamBytes int64  `expr:"param_bytes"`
}

// MeshEnv describes the mesh to an expression.
type MeshEnv struct {
	Nodes       int `expr:"nodes"`
	GPUsPerNode int `expr:"gpus_per_node"`
	WorldSize   int `expr:"world_size"`
	DP          int `expr:"dp"`
	CP          int `expr:"cp"`
}

// GPUEnv describes the GPU to an expression.
type GPUEnv struct {
	Name        string `expr:"name"`
	MemoryBytes int64  `expr:"memory_bytes"`
}

// StageEnv describes the current stage to an expression.
type StageEnv struct {
	ID   string `expr:"id"`
	Kind string `expr:"kind"`
}
