package spec

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"github.com/rlpipe/rlpipe/gpu"
	"go.yaml.in/yaml/v3"
)

// Version is the spec version this package reads.
const Version = 1

var (
	nameRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	stageIDRE = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
)

// Precisions are the values the precision policy may return.
var Precisions = []string{"bf16", "fp32"}

// Decays are the learning-rate decay schedules of train.decay.
var Decays = []string{"constant", "linear", "cosine"}

// Load reads and parses the spec file at path; see Parse. When the file
// cannot be read, the spec is nil and the error an Errors holding one error
// at path.
func Load(path string) (*Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		msg := err.Error()
		var pe *fs.PathError
		if errors.As(err, &pe) {
			msg = pe.Err.Error()
		}
		return nil, Errors{Errorf(Pos{File: path}, "cannot read spec: %s", msg)}
	}
	return Parse(path, data)
}

// Parse parses and validates a spec read from file. Relative paths in the
// spec are resolved against the directory of file. The file's text is
// registered with RegisterSource so that errors can show their lines. Parse
// does not check that files exist, that stage kinds are known, or that
// `needs` name existing stages.
//
// On success the error is nil and the spec valid. On error the error is an
// Errors holding every problem found, sorted by position, and the spec is
// nil when the YAML did not parse (a syntax error, an empty file, or a top
// level that is not a mapping); otherwise it is the partial spec, with every
// invalid value replaced by its default or zero, for callers that want to
// report further problems in the same pass. See Spec for what a partial
// spec holds, and Spec.Bad for the sections whose values it changed.
func Parse(file string, data []byte) (*Spec, error) {
	RegisterSource(file, data)
	d := &decoder{file: file}
	root := d.parseYAML(data)
	if root == nil {
		return nil, d.errs.Err()
	}
	s := d.spec(root)
	return s, d.errs.Err()
}

// spec decodes and validates the whole spec. When it finds errors it makes s
// the partial spec (see sanitize) and records its bad sections. It returns
// nil when root is not a mapping.
func (d *decoder) spec(root *yaml.Node) *Spec {
	s := &Spec{File: d.file, Dir: filepath.Dir(d.file)}
	root = resolve(root)
	if root == nil || root.Kind != yaml.MappingNode {
		d.errorf(root, "the spec must be a mapping of keys (version, name, ...), got %s", describe(root))
		return nil
	}
	top := d.mapping(root, root, "", topKeys)
	var scalars, sections []string
	for _, k := range topDefs {
		switch {
		case !k.required:
		case k.typ == typeMapping:
			sections = append(sections, k.name)
		default:
			scalars = append(scalars, k.name)
		}
	}
	d.require(top, scalars...)
	bad := map[string]bool{}
	for _, k := range sections {
		if top.get(k) == nil && !top.bad {
			d.errorf(root, "missing required key %q", k) // a null section is reported inside it
			bad[k] = true
		}
	}
	if n := top.get("version"); !isNull(n) {
		if v, ok := d.intValue(n, "version", 64); ok {
			if v != Version {
				d.errorf(n, "unsupported spec version %d (this rlpipe reads version %d)", v, Version)
			}
			s.Version = int(v)
		}
	}
	if n := top.get("name"); !isNull(n) {
		if v, ok := d.stringValue(n, "name"); ok {
			if !nameRE.MatchString(v) {
				d.errorf(n, "name: invalid name %q: use letters, digits, '.', '_' and '-', starting with a letter or digit", v)
			}
			s.Name = v
		}
	}
	// section runs decode and marks key bad when it reports an error.
	section := func(key string, decode func()) {
		n := len(d.errs)
		decode()
		if len(d.errs) > n {
			bad[key] = true
		}
	}
	var batchOK bool
	section("models", func() { d.models(s, top) })
	section("mesh", func() { d.mesh(s, top) })
	section("data", func() { batchOK = d.data(s, top) })
	section("train", func() { d.train(s, top, batchOK) })
	section("policies", func() { d.policies(s, top) })
	section("stages", func() { d.stages(s, top) })
	s.positions = d.positions(root)
	if len(d.errs) == 0 {
		return s
	}
	for k := range sanitize(s, d.facts) {
		bad[k] = true
	}
	if s.Version == 0 {
		bad["version"] = true
	}
	if s.Name == "" {
		bad["name"] = true
	}
	s.bad = bad
	return s
}

// section returns the pairs of the top-level mapping under key, checked
// against the keys topDefs defines for it, and the position of that key.
func (d *decoder) section(top *fields, key string) (*fields, Pos) {
	k := top.keyNode(key)
	defs := lookupKey(topDefs, key).keys
	f := d.mapping(top.get(key), k, key, keyNames(defs))
	f.defs = defs
	if k == nil {
		return f, Pos{}
	}
	return f, d.pos(k)
}

// Upper bounds of the integer keys of the spec. They are far above any real
// job and keep the numbers a planner multiplies within int64: tokens of a
// micro-batch (MaxTokens) times a hidden size, a vocabulary and a byte size
// of up to 2^16, 2^18 and 2^3 stay at most 2^61; the samples of a step times
// their length (MaxRolloutSamples × MaxTokens) at most 2^44. Every bound but
// MaxGPUBytes and that of train.seed also fits in an int32.
const (
	MaxNodes            = 1 << 10                   // mesh.nodes
	MaxGPUsPerNode      = 1 << 6                    // mesh.gpus_per_node
	MaxDP               = MaxNodes * MaxGPUsPerNode // mesh.dp (2^16)
	MaxGPUBytes         = 1 << 50                   // mesh.gpu as a byte count (1 PiB)
	MaxGlobalBatchSize  = 1 << 20                   // data.global_batch_size
	MaxSamplesPerPrompt = 1 << 16                   // data.samples_per_prompt
	MaxRolloutSamples   = 1 << 20                   // data.rollout_batch_size, and it times samples_per_prompt
	MaxTokens           = 1 << 24                   // data.max_tokens_per_gpu and data.max_seq_len
	MaxSteps            = 1 << 20                   // train.steps and train.checkpoint_every
	MaxPPOEpochs        = 1 << 10                   // train.ppo_epochs
	MaxUpdates          = 1<<31 - 1                 // train.warmup_steps, train.decay_steps and the run's total optimizer updates
)

// intIn decodes the integer under key into out and checks that it lies in
// the bounds the key's definition gives. It returns the value node (nil
// when the key is absent) and whether the value is valid; an invalid value
// has been reported and leaves out unchanged.
func intIn[T int | int64](d *decoder, f *fields, key string, out *T) (*yaml.Node, bool) {
	n := f.get(key)
	if n == nil {
		return nil, false
	}
	k := f.def(key)
	v, ok := d.boundedInt(n, join(f.path, key), k.min, k.max)
	if ok {
		*out = T(v)
	}
	return n, ok
}

// boundedInt decodes an integer scalar in [lo, hi]. Integers beyond int64
// are reported as out of bounds, like any other.
func (d *decoder) boundedInt(n *yaml.Node, path string, lo, hi int64) (int64, bool) {
	n = resolve(n)
	big := n != nil && n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" && bigIntRE.MatchString(n.Value)
	var v int64
	if !big {
		if n == nil || n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
			d.errorf(n, "%s: want an integer, got %s", path, describe(n))
			return 0, false
		}
		big = n.Decode(&v) != nil
	}
	switch {
	case big && strings.HasPrefix(n.Value, "-"):
		d.errorf(n, "%s: must be at least %d, got %s", path, lo, n.Value)
	case big:
		d.errorf(n, "%s: must be at most %d, got %s", path, hi, n.Value)
	case v < lo:
		d.errorf(n, "%s: must be at least %d, got %d", path, lo, v)
	case v > hi:
		d.errorf(n, "%s: must be at most %d, got %d", path, hi, v)
	default:
		return v, true
	}
	return 0, false
}

// floatField decodes the number under key into out and reports it when it
// lies outside the range the key's definition gives; it stores it in out
// all the same. It returns the value node (nil when the key is absent or
// not a number) and whether the value is a number (true when absent).
func (d *decoder) floatField(f *fields, key string, out *float64) (n *yaml.Node, ok bool) {
	n = f.get(key)
	if n == nil {
		return nil, true
	}
	path := join(f.path, key)
	v, ok := d.floatValue(n, path)
	if !ok {
		return nil, false
	}
	*out = v
	d.inRange(n, path, v, f.def(key).rng)
	return n, true
}

// inRange reports the number v at n when it lies outside r.
func (d *decoder) inRange(n *yaml.Node, path string, v float64, r numRange) {
	var msg string
	switch {
	case r == positiveNumber && !(v > 0):
		msg = "must be greater than 0"
	case r == nonNegativeNumber && v < 0:
		msg = "must not be negative"
	case r == unitNumber && (v < 0 || v >= 1):
		msg = "must be in [0, 1)"
	default:
		return
	}
	d.errorf(n, "%s: %s, got %s", path, msg, n.Value)
}

// resolvePath resolves a path of the spec against the spec's directory.
func resolvePath(dir, p string) string {
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	return filepath.Join(dir, p)
}

// models decodes `models:`.
func (d *decoder) models(s *Spec, top *fields) {
	f, _ := d.section(top, "models")
	if f.bad || top.get("models") == nil {
		return
	}
	type copyRef struct {
		m *Model
		n *yaml.Node
	}
	var copies []copyRef
	byName := map[string]*Model{}
	var actor *Model
	for _, name := range f.order {
		kv := f.m[name]
		path := "models." + name
		if !nameRE.MatchString(name) {
			d.errorf(kv.key, "models: invalid model name %q: use letters, digits, '.', '_' and '-', starting with a letter or digit", name)
		}
		mf := d.mapping(kv.val, kv.key, path, modelKeys)
		m := &Model{Name: name, Pos: d.pos(kv.key)}
		s.Models = append(s.Models, m)
		byName[name] = m
		if mf.bad {
			continue
		}
		switch n := mf.get("role"); {
		case !isNull(n):
			if v, ok := d.stringValue(n, path+".role"); ok {
				if !contains(roles, v) {
					d.errorf(n, "%s.role: want %s, got %q", path, quoteList(roles), v)
				} else {
					m.Role = v
				}
			}
		case name == "actor" || name == "ref":
			m.Role = name
		default:
			d.errorf(kv.key, "%s: missing required key \"role\" (only models named actor or ref have a default role)", path)
		}
		if m.Role == "actor" {
			if actor != nil {
				d.errorf(kv.key, "%s: a second actor (model %q is already the actor; exactly one model has role \"actor\")", path, actor.Name)
			} else {
				actor = m
			}
		}
		hasPath, hasCopy := mf.has("path"), mf.has("copy_of")
		switch {
		case hasPath && hasCopy:
			d.errorf(mf.keyNode("copy_of"), "%s: set either path or copy_of, not both", path)
		case !hasPath && !hasCopy:
			d.errorf(kv.key, "%s: missing required key \"path\" (or \"copy_of\")", path)
		case hasPath:
			n := mf.get("path")
			if v, ok := d.stringValue(n, path+".path"); ok {
				if strings.TrimSpace(v) == "" {
					d.errorf(n, "%s.path: must not be empty", path)
				} else {
					m.Path = resolvePath(s.Dir, v)
				}
			}
		default:
			n := mf.get("copy_of")
			if v, ok := d.stringValue(n, path+".copy_of"); ok {
				m.CopyOf = v
				copies = append(copies, copyRef{m, n})
			}
		}
	}
	for _, c := range copies {
		src, ok := byName[c.m.CopyOf]
		path := "models." + c.m.Name + ".copy_of"
		switch {
		case c.m.CopyOf == c.m.Name:
			d.errorf(c.n, "%s: a model cannot be a copy of itself", path)
		case !ok:
			names := make([]string, 0, len(s.Models))
			for _, m := range s.Models {
				if m != c.m {
					names = append(names, m.Name)
				}
			}
			d.errorf(c.n, "%s: unknown model %q %s", path, c.m.CopyOf, suggest(c.m.CopyOf, names))
		case src.CopyOf != "":
			d.errorf(c.n, "%s: model %q is itself a copy; copy_of must name a model with a path", path, c.m.CopyOf)
		}
	}
	if actor == nil {
		at := top.keyNode("models")
		d.errorf(at, "models: exactly one model must have role \"actor\", found none")
	}
}

// mesh decodes `mesh:`.
func (d *decoder) mesh(s *Spec, top *fields) {
	f, pos := d.section(top, "mesh")
	m := &s.Mesh
	m.Nodes, m.GPUsPerNode, m.Pos = 1, 1, pos
	nodesN, nodesOK := intIn(d, f, "nodes", &m.Nodes)
	gpusN, gpusOK := intIn(d, f, "gpus_per_node", &m.GPUsPerNode)
	worldOK := (nodesN == nil || nodesOK) && (gpusN == nil || gpusOK)
	m.CP = 1
	cpN, cpOK := intIn(d, f, "cp", &m.CP)
	if cpN != nil && cpOK && worldOK && m.WorldSize()%m.CP != 0 {
		d.errorf(cpN, "mesh.cp: must divide nodes × gpus_per_node = %d, got %d", m.WorldSize(), m.CP)
		cpOK = false
	}
	if cpN == nil {
		cpOK = true
	} else if !cpOK {
		m.CP = 1
	}
	m.DP = 0
	if dpN, dpOK := intIn(d, f, "dp", &m.DP); dpN == nil {
		if worldOK && m.WorldSize()%m.CP == 0 {
			m.DP = m.WorldSize() / m.CP
		}
	} else if dpOK && worldOK && cpOK && m.DP*m.CP != m.WorldSize() {
		if m.CP == 1 {
			d.errorf(dpN, "mesh.dp: must equal nodes × gpus_per_node = %d (dp × cp is the world, and cp is 1), got %d", m.WorldSize(), m.DP)
		} else {
			d.errorf(dpN, "mesh.dp: must equal nodes × gpus_per_node / cp = %d / %d = %d (dp × cp is the world), got %d", m.WorldSize(), m.CP, m.WorldSize()/m.CP, m.DP)
		}
	}
	if n := f.get("gpu"); n != nil {
		k := f.def("gpu")
		switch {
		case n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float" && bigIntRE.MatchString(n.Value)):
			if strings.HasPrefix(n.Value, "-") || n.ShortTag() == "!!int" && isZero(n) {
				d.errorf(n, "mesh.gpu: a memory size must be a positive byte count, got %s", n.Value)
			} else if v, ok := d.boundedInt(n, "mesh.gpu", k.min, k.max); ok {
				m.GPU = strconv.FormatInt(v, 10)
			}
		case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str":
			if strings.TrimSpace(n.Value) == "" {
				d.errorf(n, "mesh.gpu: must not be empty")
			} else {
				m.GPU = n.Value
			}
		default:
			d.errorf(n, "mesh.gpu: want a memory preset name or a byte count, got %s", describe(n))
		}
	}
	if n := f.get("host_memory"); n != nil {
		if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!str" && n.ShortTag() != "!!float") {
			d.errorf(n, "mesh.host_memory: want a byte count or a size such as 2TiB, got %s", describe(n))
		} else if v, err := gpu.ParseBytes(n.Value, "mesh.host_memory"); err != nil {
			d.errorf(n, "%v", err)
		} else {
			m.HostMemory = v
		}
	}
}

// isZero reports whether the integer scalar n is 0.
func isZero(n *yaml.Node) bool {
	var v int64
	return n.Decode(&v) == nil && v == 0
}

// data decodes `data:`. It reports whether the batch sizes are all valid,
// so that Spec.UpdatesPerStep can be computed.
func (d *decoder) data(s *Spec, top *fields) (batchOK bool) {
	f, pos := d.section(top, "data")
	if top.get("data") != nil {
		d.require(f, requiredKeys(f.defs)...)
	}
	x := &s.Data
	x.Pos, x.SamplesPerPrompt, x.Temperature = pos, 1, 1
	for _, p := range []struct {
		key string
		out *string
	}{{"rollouts", &x.Rollouts}, {"prompts", &x.Prompts}} {
		if n := f.get(p.key); !isNull(n) {
			if v, ok := d.stringValue(n, "data."+p.key); ok {
				if strings.TrimSpace(v) == "" {
					d.errorf(n, "data.%s: must not be empty", p.key)
				} else {
					*p.out = resolvePath(s.Dir, v)
				}
			}
		}
	}
	gbsN, gbsOK := intIn(d, f, "global_batch_size", &x.GlobalBatchSize)
	sppN, sppOK := intIn(d, f, "samples_per_prompt", &x.SamplesPerPrompt)
	sppOK = sppOK || sppN == nil
	groupsOK := gbsOK && sppOK && x.GlobalBatchSize%x.SamplesPerPrompt == 0
	if gbsOK && sppOK && !groupsOK {
		at := sppN
		if at == nil {
			at = gbsN
		}
		d.fail("data.global_batch_size")
		d.errorf(at, "data.global_batch_size (%d) must be a multiple of samples_per_prompt (%d)", x.GlobalBatchSize, x.SamplesPerPrompt)
	}
	if gbsOK && s.Mesh.DP >= 1 && x.GlobalBatchSize%s.Mesh.DP != 0 {
		d.fail("data.global_batch_size")
		d.errorf(gbsN, "data.global_batch_size (%d) must be a multiple of mesh.dp (%d)", x.GlobalBatchSize, s.Mesh.DP)
	}
	rbsN, rbsOK := intIn(d, f, "rollout_batch_size", &x.RolloutBatchSize)
	d.facts.defaultRollout = rbsN == nil
	switch {
	case rbsN == nil:
		if groupsOK {
			x.RolloutBatchSize = x.GlobalBatchSize / x.SamplesPerPrompt
			batchOK = true
		}
	case rbsOK && sppOK:
		b := x.RolloutSamples()
		switch {
		case b > MaxRolloutSamples:
			d.fail("data.rollout_batch_size")
			d.errorf(rbsN, "data.rollout_batch_size: %d prompt groups × samples_per_prompt (%d) = %d samples per step; must be at most %d",
				x.RolloutBatchSize, x.SamplesPerPrompt, b, MaxRolloutSamples)
		case gbsOK && b%x.GlobalBatchSize != 0:
			d.fail("data.rollout_batch_size")
			d.errorf(rbsN, "data.rollout_batch_size: %d prompt groups × samples_per_prompt (%d) = %d samples per step must be a multiple of global_batch_size (%d)",
				x.RolloutBatchSize, x.SamplesPerPrompt, b, x.GlobalBatchSize)
		default:
			batchOK = groupsOK
		}
	}
	mtN, mtOK := intIn(d, f, "max_tokens_per_gpu", &x.MaxTokensPerGPU)
	x.MaxSeqLen = 0
	cp := max(s.Mesh.CP, 1)
	if msN, msOK := intIn(d, f, "max_seq_len", &x.MaxSeqLen); msN == nil {
		x.MaxSeqLen = min(MaxSeqFits(x.MaxTokensPerGPU, cp), MaxTokens)
	} else if msOK && mtN != nil && mtOK && SeqRows(x.MaxSeqLen, cp) > x.MaxTokensPerGPU {
		d.fail("data.max_seq_len")
		if cp == 1 {
			d.errorf(msN, "data.max_seq_len (%d) must not exceed max_tokens_per_gpu (%d): a sample must fit in one micro-batch", x.MaxSeqLen, x.MaxTokensPerGPU)
		} else {
			d.errorf(msN, "data.max_seq_len (%d) puts %d rows on each of mesh.cp %d ranks, more than max_tokens_per_gpu (%d): a sample must fit in one micro-batch (at most %d tokens)",
				x.MaxSeqLen, SeqRows(x.MaxSeqLen, cp), cp, x.MaxTokensPerGPU, MaxSeqFits(x.MaxTokensPerGPU, cp))
		}
	}
	d.floatField(f, "temperature", &x.Temperature)
	return batchOK
}

// boolField decodes the boolean under key into out. It returns the value
// node (nil when the key is absent) and whether the value is valid.
func (d *decoder) boolField(f *fields, key string, out *bool) (*yaml.Node, bool) {
	n := f.get(key)
	if n == nil {
		return nil, false
	}
	v, ok := d.boolValue(n, join(f.path, key))
	if ok {
		*out = v
	}
	return n, ok
}

// train decodes `train:`. batchOK says whether the data section's batch
// sizes are valid, so that the optimizer updates of the run are known.
func (d *decoder) train(s *Spec, top *fields, batchOK bool) {
	f, pos := d.section(top, "train")
	if top.get("train") != nil {
		d.require(f, requiredKeys(f.defs)...)
	}
	t := &s.Train
	t.Pos, t.PPOEpochs, t.Seed = pos, 1, 1
	t.LR, t.Betas, t.Eps, t.GradClip, t.Decay = 1e-6, [2]float64{0.9, 0.95}, 1e-8, 1.0, "constant"
	stepsN, stepsOK := intIn(d, f, "steps", &t.Steps)
	epN, epOK := intIn(d, f, "ppo_epochs", &t.PPOEpochs)
	updatesOK := stepsOK && (epN == nil || epOK) && batchOK
	if updatesOK && s.TotalUpdates() > MaxUpdates {
		d.fail("train.steps")
		d.errorf(stepsN, "train.steps: %d steps × %d optimizer updates per step (ppo_epochs × rollout samples / global_batch_size) = %d updates; must be at most %d",
			t.Steps, s.UpdatesPerStep(), s.TotalUpdates(), MaxUpdates)
		updatesOK = false
	}
	shN, shOK := d.boolField(f, "shuffle", &t.Shuffle)
	if sgN, sgOK := d.boolField(f, "shuffle_groups", &t.ShuffleGroups); sgOK && t.ShuffleGroups && (shN == nil || shOK) && !t.Shuffle {
		d.fail("train.shuffle_groups")
		d.errorf(sgN, "train.shuffle_groups: true needs shuffle: true (without shuffling, every epoch visits the samples in rollout order)")
	}
	intIn(d, f, "seed", &t.Seed)
	_, lrOK := d.floatField(f, "lr", &t.LR)
	lrOK = lrOK && t.LR > 0
	minN, _ := d.floatField(f, "min_lr", &t.MinLR)
	if minN != nil && lrOK && t.MinLR > t.LR {
		d.fail("train.min_lr")
		d.errorf(minN, "train.min_lr (%g) must not exceed lr (%g)", t.MinLR, t.LR)
	}
	if n := f.get("betas"); n != nil {
		if n.Kind != yaml.SequenceNode || len(n.Content) != 2 {
			got := describe(n)
			if n.Kind == yaml.SequenceNode {
				got = fmt.Sprintf("a list of %d", len(n.Content))
			}
			d.errorf(n, "train.betas: want a list of 2 numbers [beta1, beta2], got %s", got)
		} else {
			for i, c := range n.Content {
				path := fmt.Sprintf("train.betas[%d]", i)
				if v, ok := d.floatValue(c, path); ok {
					d.inRange(resolve(c), path, v, f.def("betas").rng)
					t.Betas[i] = v
				}
			}
		}
	}
	d.floatField(f, "eps", &t.Eps)
	d.floatField(f, "weight_decay", &t.WeightDecay)
	d.floatField(f, "grad_clip", &t.GradClip)
	wsN, wsOK := intIn(d, f, "warmup_steps", &t.WarmupSteps)
	wsOK = wsOK || wsN == nil
	wiN, _ := d.floatField(f, "warmup_init_lr", &t.WarmupInitLR)
	if wiN != nil && lrOK && t.WarmupInitLR > t.LR {
		d.fail("train.warmup_init_lr")
		d.errorf(wiN, "train.warmup_init_lr (%g) must not exceed lr (%g)", t.WarmupInitLR, t.LR)
	}
	decayN, decayOK := f.get("decay"), true
	if decayN != nil {
		decayOK = false
		if v, ok := d.stringValue(decayN, "train.decay"); ok {
			if !contains(Decays, v) {
				d.errorf(decayN, "train.decay: want one of %s, got %q", quoteList(Decays), v)
			} else {
				t.Decay, decayOK = v, true
			}
		}
	}
	dsN, dsOK := intIn(d, f, "decay_steps", &t.DecaySteps)
	dsOK = dsOK || dsN == nil
	byDefault := t.DecaySteps == 0
	d.facts.defaultDecay = byDefault
	if byDefault && updatesOK {
		t.DecaySteps = int(s.TotalUpdates())
	}
	if decayOK && t.Decay != "constant" && wsOK && dsOK && (updatesOK || !byDefault) && t.DecaySteps <= t.WarmupSteps {
		if byDefault {
			d.fail("train.warmup_steps")
			d.errorf(wsN, "train.warmup_steps (%d) must be less than decay_steps (%d: by default the run's optimizer updates, steps × updates per step) for %s decay",
				t.WarmupSteps, t.DecaySteps, t.Decay)
		} else {
			d.fail("train.decay_steps")
			d.errorf(dsN, "train.decay_steps (%d) must exceed warmup_steps (%d) for %s decay", t.DecaySteps, t.WarmupSteps, t.Decay)
		}
	}
	intIn(d, f, "checkpoint_every", &t.CheckpointEvery)
	d.boolField(f, "checkpoint_async", &t.CheckpointAsync)
}

// quoteList formats list as "a", "b" or "c".
func quoteList(list []string) string {
	q := make([]string, len(list))
	for i, s := range list {
		q[i] = strconv.Quote(s)
	}
	if len(q) <= 1 {
		return strings.Join(q, "")
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}

// expr compiles the expression under key, recording any error.
func (d *decoder) expr(f *fields, key string, kind reflect.Kind) *Expr {
	n := f.get(key)
	if n == nil {
		return nil
	}
	e, err := CompileNode(d.file, n, kind, join(f.path, key))
	if err != nil {
		d.errs.Append(err)
		return nil
	}
	return e
}

// autoExpr decodes a bool policy that may be written auto: nil for auto
// (the default), which planning resolves.
func (d *decoder) autoExpr(f *fields, key string) *Expr {
	if n := resolve(f.get(key)); n != nil && n.Kind == yaml.ScalarNode && n.Value == "auto" && n.ShortTag() == "!!str" {
		return nil
	}
	return d.expr(f, key, reflect.Bool)
}

// policies decodes `policies:`.
func (d *decoder) policies(s *Spec, top *fields) {
	f, _ := d.section(top, "policies")
	p := &s.Policies
	p.Offload = d.expr(f, "offload", reflect.Bool)
	p.OffloadOptimizer = d.expr(f, "offload_optimizer", reflect.Bool)
	p.Recompute = d.autoExpr(f, "recompute")
	p.RecomputeElementwise = d.autoExpr(f, "recompute_elementwise")
	p.Precision = d.expr(f, "precision", reflect.String)
	if p.Precision != nil {
		n := f.get("precision")
		values, offsets := p.Precision.StringResults()
		for i, v := range values {
			if !contains(Precisions, v) {
				d.errs.Addf(ValuePos(d.file, n, offsets[i]), "policies.precision: unknown precision %q (want %s)", v, quoteList(Precisions))
			}
		}
	}
}

// stages decodes `stages:`.
func (d *decoder) stages(s *Spec, top *fields) {
	f, _ := d.section(top, "stages")
	ids := map[string]*yaml.Node{}
	for _, phase := range []Phase{Setup, Step} {
		n := f.get(string(phase))
		if isNull(n) {
			continue
		}
		if n.Kind != yaml.SequenceNode {
			d.errorf(n, "stages.%s: want a list of stages, got %s", phase, describe(n))
			continue
		}
		for i, e := range n.Content {
			if st := d.stage(e, phase, fmt.Sprintf("stages.%s[%d]", phase, i), ids); st != nil {
				if phase == Setup {
					s.Setup = append(s.Setup, st)
				} else {
					s.Step = append(s.Step, st)
				}
			}
		}
	}
}

// stage decodes one entry of stages.setup or stages.step.
func (d *decoder) stage(e *yaml.Node, phase Phase, path string, ids map[string]*yaml.Node) *Stage {
	e = resolve(e)
	if e == nil || e.Kind != yaml.MappingNode {
		d.errorf(e, "%s: want a stage (a mapping with id and uses), got %s", path, describe(e))
		return nil
	}
	f := d.mapping(e, e, path, stageKeys)
	d.require(f, requiredKeys(stageDefs)...)
	st := &Stage{Phase: phase, Pos: d.pos(e)}
	if n := f.get("id"); !isNull(n) {
		if v, ok := d.stringValue(n, path+".id"); ok {
			switch prev, dup := ids[v]; {
			case !stageIDRE.MatchString(v):
				d.errorf(n, "%s.id: invalid id %q: use lower-case letters, digits and '_', starting with a letter", path, v)
			case dup:
				d.errorf(n, "%s.id: duplicate stage id %q (first at line %d)", path, v, prev.Line)
			default:
				ids[v] = n
			}
			st.ID = v
		}
	}
	if n := f.get("uses"); !isNull(n) {
		if v, ok := d.stringValue(n, path+".uses"); ok {
			if strings.TrimSpace(v) == "" {
				d.errorf(n, "%s.uses: must not be empty", path)
			}
			st.Uses = v
		}
		st.UsesPos = d.pos(n)
	}
	if n := f.get("needs"); !isNull(n) {
		items := []*yaml.Node{n}
		if n.Kind == yaml.SequenceNode {
			items = n.Content
		}
		for i, c := range items {
			c = resolve(c)
			p := path + ".needs"
			if n.Kind == yaml.SequenceNode {
				p = fmt.Sprintf("%s[%d]", p, i)
			}
			if c == nil || c.Kind != yaml.ScalarNode || c.ShortTag() != "!!str" {
				d.errorf(c, "%s: want a stage id or a list of stage ids, got %s", p, describe(c))
				continue
			}
			if c.Value == "" {
				d.errorf(c, "%s: must not be empty", p)
				continue
			}
			st.Needs = append(st.Needs, Ref{Name: c.Value, Pos: d.pos(c)})
		}
	}
	if n := f.get("with"); !isNull(n) {
		if n.Kind != yaml.MappingNode {
			d.errorf(n, "%s.with: want a mapping of parameters, got %s", path, describe(n))
		} else {
			st.With = n
		}
	}
	st.When = d.expr(f, "when", reflect.Bool)
	return st
}

// DecodeWith decodes the stage's `with:` block into the struct out points to
// with DecodeStrict. A required key missing from an absent `with:` block is
// reported at the stage entry.
func (s *Stage) DecodeWith(out any) Errors {
	if s.With != nil {
		return DecodeStrictIn(s.Pos.File, s.With, out, "with")
	}
	at := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: s.Pos.Line, Column: s.Pos.Col}
	return DecodeStrictIn(s.Pos.File, at, out, "with")
}
