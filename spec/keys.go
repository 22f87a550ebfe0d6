package spec

import (
	"fmt"
	"math"
	"strings"

	"github.com/rlpipe/rlpipe/gpu"
)

// valueType is the type of the value a key of the spec takes.
type valueType int

// The types of the keys of the spec.
const (
	typeInt        valueType = iota + 1 // an integer within keyDef.min and keyDef.max
	typeNumber                          // a finite number within keyDef.rng; integers are accepted
	typeNumberPair                      // a list of two numbers, each within keyDef.rng
	typeBool                            // true or false
	typeString                          // a string
	typeMapping                         // a mapping of the keys keyDef.keys
	typeList                            // a list; keyDef.schema says of what
	typeBoolExpr                        // an expression (policies.md) that returns a bool
	typeStringExpr                      // an expression that returns a string
)

// numRange is the range of values a number key accepts.
type numRange int

// The ranges of number keys.
const (
	anyNumber         numRange = iota
	positiveNumber             // > 0
	nonNegativeNumber          // >= 0
	unitNumber                 // in [0, 1)
)

// keyDef describes one key of a mapping of the spec. The decoder takes from
// it the keys a mapping accepts, the keys it requires, the bounds of an
// integer, the range of a number and the values of an enum; the JSON Schema
// of `rlpipe schema` is generated from all of it, so that the two cannot
// disagree on which keys exist.
type keyDef struct {
	name     string
	typ      valueType
	doc      string // one or two sentences for the schema's description
	required bool   // the decoder reports the key when it is absent or null
	nullable bool   // null is accepted and reads as the key's absence
	nonEmpty bool   // a string that must not be blank
	pattern  string // a string must match it (RE2 syntax that is also ECMAScript syntax)
	min, max int64  // bounds of a typeInt value
	rng      numRange
	enum     []string
	def      any      // the default, where it is a fixed value
	keys     []keyDef // the keys of a typeMapping value; nil accepts any key
	// schema, when set, builds the schema of a value the fields above
	// cannot describe (the fields above still apply where they can).
	schema func(k *keyDef, g *schemaGen) *jsonSchema
}

// roles are the values of models.*.role.
var roles = []string{"actor", "ref"}

// The keys of each mapping of the spec, in documentation order.
var (
	topDefs = []keyDef{
		{name: "version", typ: typeInt, required: true, schema: versionSchema,
			doc: fmt.Sprintf("Spec version; must be %d.", Version)},
		{name: "name", typ: typeString, required: true, pattern: nameRE.String(),
			doc: "Job name: letters, digits, '.', '_' and '-', starting with a letter or digit."},
		{name: "models", typ: typeMapping, required: true, schema: modelsSchema,
			doc: "The models, by name (letters, digits, '.', '_', '-'). Exactly one has role actor."},
		{name: "mesh", typ: typeMapping, nullable: true, keys: meshDefs,
			doc: "The device mesh: nodes, GPUs per node, data and context parallelism, memory."},
		{name: "data", typ: typeMapping, required: true, keys: dataDefs,
			doc: "The rollout data and how it is batched."},
		{name: "train", typ: typeMapping, required: true, keys: trainDefs,
			doc: "The training loop and the optimizer's hyper-parameters."},
		{name: "policies", typ: typeMapping, nullable: true, keys: policiesDefs,
			doc: "Per-model and per-layer decisions written as expressions (policies.md); all optional."},
		{name: "stages", typ: typeMapping, nullable: true, keys: stagesDefs,
			doc: "The pipeline: the setup stages, run once, and the step stages, run every training step."},
	}
	modelDefs = []keyDef{
		{name: "role", typ: typeString, nullable: true, enum: roles,
			doc: "actor or ref; by default the model's name when that is actor or ref, and required for other names."},
		{name: "path", typ: typeString, nullable: true, nonEmpty: true,
			doc: "HF checkpoint directory (config.json and model.safetensors or model.safetensors.index.json), relative to the spec file. Set either path or copy_of."},
		{name: "copy_of", typ: typeString, nullable: true,
			doc: "Name of another model that has a path: this model starts as a copy of it (copied from the source's shards on the device when a setup stage shards the source). Set either path or copy_of."},
	}
	meshDefs = []keyDef{
		{name: "nodes", typ: typeInt, min: 1, max: MaxNodes, def: 1,
			doc: "Number of nodes."},
		{name: "gpus_per_node", typ: typeInt, min: 1, max: MaxGPUsPerNode, def: 1,
			doc: "GPUs (ranks) on each node."},
		{name: "dp", typ: typeInt, min: 1, max: MaxDP,
			doc: "Data-parallel size; by default nodes × gpus_per_node / cp. dp × cp must equal nodes × gpus_per_node."},
		{name: "cp", typ: typeInt, min: 1, max: MaxDP, def: 1,
			doc: "Context-parallel size: each sequence is split over cp ranks (ring attention). A divisor of nodes × gpus_per_node."},
		{name: "gpu", typ: typeString, nonEmpty: true, min: 1, max: MaxGPUBytes, schema: gpuSchema,
			doc: fmt.Sprintf("A GPU memory preset name (%s) or a byte count; by default the CLI's --gpu, then NVML. The CLI's --gpu overrides it.", strings.Join(gpu.PresetNames(), ", "))},
		{name: "host_memory", typ: typeString, schema: hostMemorySchema,
			doc: "A node's RAM, a byte count or a size such as 2TiB or 512GiB: the plan checks the node's pinned arenas and host buffers against it."},
	}
	dataDefs = []keyDef{
		{name: "rollouts", typ: typeString, nullable: true, nonEmpty: true,
			doc: "JSONL file of rollouts, relative to the spec file (data.md); required unless a stage (generate) produces the rollouts."},
		{name: "prompts", typ: typeString, nullable: true, nonEmpty: true,
			doc: "JSONL file of prompts for a generate stage (engines.md), relative to the spec file."},
		{name: "global_batch_size", typ: typeInt, required: true, min: 1, max: MaxGlobalBatchSize,
			doc: "Samples per optimizer update (one mini-batch) over all dp ranks; a multiple of samples_per_prompt and of mesh.dp."},
		{name: "samples_per_prompt", typ: typeInt, min: 1, max: MaxSamplesPerPrompt, def: 1,
			doc: "GRPO group size n."},
		{name: "rollout_batch_size", typ: typeInt, min: 1, max: MaxRolloutSamples,
			doc: "Prompt groups per training step; by default global_batch_size / samples_per_prompt. Times samples_per_prompt, a multiple of global_batch_size."},
		{name: "max_tokens_per_gpu", typ: typeInt, required: true, min: 1, max: MaxTokens,
			doc: "Rows of one packed micro-batch on a GPU."},
		{name: "max_seq_len", typ: typeInt, min: 1, max: MaxTokens,
			doc: "Longest sample (prompt + response); by default the longest that fits in max_tokens_per_gpu."},
		{name: "temperature", typ: typeNumber, rng: positiveNumber, def: 1.0,
			doc: "Rollout sampling temperature, used for the log-probs."},
	}
	trainDefs = []keyDef{
		{name: "steps", typ: typeInt, required: true, min: 1, max: MaxSteps,
			doc: "Training steps; each consumes one rollout batch."},
		{name: "ppo_epochs", typ: typeInt, min: 1, max: MaxPPOEpochs, def: 1,
			doc: "Passes over the rollout batch in each step."},
		{name: "shuffle", typ: typeBool, def: false,
			doc: "Each epoch visits the step's samples in a random order drawn from seed (else in rollout order)."},
		{name: "shuffle_groups", typ: typeBool, def: false,
			doc: "The random order keeps each prompt group's samples together; needs shuffle: true."},
		{name: "seed", typ: typeInt, min: 0, max: math.MaxInt64, def: 1,
			doc: "Seed of every random choice of the run."},
		{name: "lr", typ: typeNumber, rng: positiveNumber, def: 1e-6,
			doc: "Peak learning rate."},
		{name: "min_lr", typ: typeNumber, rng: nonNegativeNumber, def: 0.0,
			doc: "Floor of the decay; at most lr."},
		{name: "betas", typ: typeNumberPair, rng: unitNumber, def: []float64{0.9, 0.95},
			doc: "AdamW β1 and β2, each in [0, 1)."},
		{name: "eps", typ: typeNumber, rng: positiveNumber, def: 1e-8,
			doc: "AdamW ε."},
		{name: "weight_decay", typ: typeNumber, rng: nonNegativeNumber, def: 0.0,
			doc: "Decoupled weight decay."},
		{name: "grad_clip", typ: typeNumber, rng: nonNegativeNumber, def: 1.0,
			doc: "Largest global L2 norm of the gradients; 0 disables clipping."},
		{name: "warmup_steps", typ: typeInt, min: 0, max: MaxUpdates, def: 0,
			doc: "Optimizer updates (not training steps) of linear warmup."},
		{name: "warmup_init_lr", typ: typeNumber, rng: nonNegativeNumber, def: 0.0,
			doc: "Learning rate of the warmup's first update; at most lr."},
		{name: "decay", typ: typeString, enum: Decays, def: "constant",
			doc: "Learning-rate decay from lr to min_lr."},
		{name: "decay_steps", typ: typeInt, min: 0, max: MaxUpdates,
			doc: "The optimizer update at which the decay reaches min_lr; 0 or absent: all of the run's updates. With linear or cosine, more than warmup_steps."},
		{name: "checkpoint_every", typ: typeInt, min: 0, max: MaxSteps, def: 0,
			doc: "Training steps between checkpoints; 0 checkpoints only at the end."},
		{name: "checkpoint_async", typ: typeBool, def: false,
			doc: "Snapshot the shards to pinned host memory at a checkpoint and write the files in the background."},
	}
	policiesDefs = []keyDef{
		{name: "offload", typ: typeBoolExpr,
			doc: "Bool expression, per model: keep its sharded parameters in pinned host memory. Default false."},
		{name: "offload_optimizer", typ: typeBoolExpr,
			doc: "Bool expression, per model: keep gradients and AdamW state in pinned host memory. Default false."},
		{name: "precision", typ: typeStringExpr,
			doc: fmt.Sprintf("String expression, per FSDP unit (embed, each decoder layer, head): the compute dtype, %s. Default \"bf16\". A literal is quoted twice: '\"fp32\"'.", quoteList(Precisions))},
		{name: "recompute", typ: typeBoolExpr, def: "auto",
			doc: "Bool expression, per decoder layer: activation checkpointing; or auto, the fewest layers that fit, chosen by the plan."},
		{name: "recompute_elementwise", typ: typeBoolExpr, def: "auto",
			doc: "Bool expression, per decoder layer that does not recompute: keep no norm or SwiGLU outputs, and recompute them in backward (the same bits, less memory); or auto: under recompute auto, the fewest such layers that fit, chosen by the plan before any layer recomputes; otherwise false."},
	}
	stagesDefs = []keyDef{
		{name: string(Setup), typ: typeList, nullable: true, schema: stageListSchema(Setup),
			doc: "Stages run once, in dependency order, before step 1."},
		{name: string(Step), typ: typeList, nullable: true, schema: stageListSchema(Step),
			doc: "Stages run on every training step."},
	}
	stageDefs = []keyDef{
		{name: "id", typ: typeString, required: true, pattern: stageIDRE.String(),
			doc: "Identifier: lower-case letters, digits and '_', starting with a letter; unique across setup and step."},
		{name: "uses", typ: typeString, required: true, nonEmpty: true,
			doc: "The stage kind (rlpipe stages lists them)."},
		{name: "needs", typ: typeString, nullable: true, schema: needsSchema,
			doc: "Id or list of ids of stages this one runs after, for ordering only: the data a stage reads orders it already."},
		{name: "with", typ: typeMapping, nullable: true,
			doc: "Parameters of the stage kind, decoded strictly by the kind."},
		{name: "when", typ: typeBoolExpr,
			doc: "Bool expression evaluated before each run of the stage (e.g. step % 10 == 0); false skips it."},
	}
)

// The names of the keys of each mapping of the spec, in documentation order.
var (
	topKeys      = keyNames(topDefs)
	modelKeys    = keyNames(modelDefs)
	meshKeys     = keyNames(meshDefs)
	dataKeys     = keyNames(dataDefs)
	trainKeys    = keyNames(trainDefs)
	policiesKeys = keyNames(policiesDefs)
	stagesKeys   = keyNames(stagesDefs)
	stageKeys    = keyNames(stageDefs)
)

// keyNames returns the names of defs, nil when defs is nil.
func keyNames(defs []keyDef) []string {
	var names []string
	for _, k := range defs {
		names = append(names, k.name)
	}
	return names
}

// requiredKeys returns the names of the required keys of defs.
func requiredKeys(defs []keyDef) []string {
	var names []string
	for _, k := range defs {
		if k.required {
			names = append(names, k.name)
		}
	}
	return names
}

// lookupKey returns the definition of the key name of defs. A key that is
// not defined is a programming error.
func lookupKey(defs []keyDef, name string) *keyDef {
	for i := range defs {
		if defs[i].name == name {
			return &defs[i]
		}
	}
	panic(fmt.Sprintf("spec: key %q is not defined", name))
}
