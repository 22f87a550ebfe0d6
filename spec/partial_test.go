package spec

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// yamlParsed reports whether the errors of Parse say that the YAML itself
// parsed into a mapping, that is, whether Parse must return a spec.
func yamlParsed(es Errors) bool {
	for _, e := range es {
		if e.Msg == "empty spec" || strings.HasPrefix(e.Msg, "invalid YAML: ") || strings.HasPrefix(e.Msg, "the spec must be a mapping") {
			return false
		}
	}
	return true
}

// invariant returns the ways in which s breaks what Spec documents of a
// partial spec, and, when valid is true, of a valid spec.
func invariant(s *Spec, valid bool) []string {
	var bad []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			bad = append(bad, fmt.Sprintf(format, args...))
		}
	}
	within := func(name string, v, lo, hi int64) {
		check(v >= lo && v <= hi, "%s = %d, not in [%d, %d]", name, v, lo, hi)
	}
	finite := func(name string, v float64) bool {
		ok := !math.IsNaN(v) && !math.IsInf(v, 0)
		check(ok, "%s = %v is not finite", name, v)
		return ok
	}
	lo := int64(0) // the lower bound of a required integer
	if valid {
		lo = 1
	}

	check(s.Version == Version || !valid && s.Version == 0, "version = %d", s.Version)
	check(nameRE.MatchString(s.Name) || !valid && s.Name == "", "name = %q", s.Name)
	check(s.Dir == filepath.Dir(s.File), "dir = %q of file %q", s.Dir, s.File)

	byName := map[string]*Model{}
	actors := 0
	for _, m := range s.Models {
		check(nameRE.MatchString(m.Name) && byName[m.Name] == nil, "model name %q invalid or repeated", m.Name)
		byName[m.Name] = m
		check(m.Role == "actor" || m.Role == "ref" || !valid && m.Role == "", "model %q: role %q", m.Name, m.Role)
		if m.Role == "actor" {
			actors++
		}
		check(m.Path == "" || m.CopyOf == "", "model %q: both path and copy_of", m.Name)
		check(m.Path == "" || strings.TrimSpace(m.Path) != "", "model %q: blank path", m.Name)
		check(!valid || m.Path != "" || m.CopyOf != "", "model %q: neither path nor copy_of", m.Name)
	}
	check(actors <= 1 && (!valid || actors == 1), "%d actors", actors)
	for _, m := range s.Models {
		if m.CopyOf != "" {
			src := byName[m.CopyOf]
			check(src != nil && src != m && src.CopyOf == "", "model %q: copy_of %q", m.Name, m.CopyOf)
		}
	}

	ms := s.Mesh
	within("mesh.nodes", int64(ms.Nodes), 1, MaxNodes)
	within("mesh.gpus_per_node", int64(ms.GPUsPerNode), 1, MaxGPUsPerNode)
	check(ms.CP >= 1 && ms.WorldSize()%ms.CP == 0 && ms.DP*ms.CP == ms.WorldSize(), "mesh.dp = %d, cp = %d, world size %d", ms.DP, ms.CP, ms.WorldSize())
	check(ms.GPU == "" || strings.TrimSpace(ms.GPU) != "", "mesh.gpu = %q", ms.GPU)

	x := s.Data
	check(x.Rollouts == "" && !valid || strings.TrimSpace(x.Rollouts) != "", "data.rollouts = %q", x.Rollouts)
	within("data.samples_per_prompt", int64(x.SamplesPerPrompt), 1, MaxSamplesPerPrompt)
	within("data.global_batch_size", int64(x.GlobalBatchSize), lo, MaxGlobalBatchSize)
	if x.SamplesPerPrompt > 0 && ms.DP > 0 {
		check(x.GlobalBatchSize%x.SamplesPerPrompt == 0 && x.GlobalBatchSize%ms.DP == 0,
			"data.global_batch_size %d, samples_per_prompt %d, dp %d", x.GlobalBatchSize, x.SamplesPerPrompt, ms.DP)
	}
	b := int64(x.RolloutBatchSize) * int64(x.SamplesPerPrompt)
	within("data.rollout_batch_size", int64(x.RolloutBatchSize), lo, MaxRolloutSamples)
	within("rollout samples", b, lo, MaxRolloutSamples)
	if x.GlobalBatchSize != 0 {
		check(x.RolloutBatchSize >= 1 && b%int64(x.GlobalBatchSize) == 0, "rollout samples %d, global_batch_size %d", b, x.GlobalBatchSize)
	}
	within("data.max_tokens_per_gpu", int64(x.MaxTokensPerGPU), lo, MaxTokens)
	within("data.max_seq_len", int64(x.MaxSeqLen), lo, MaxTokens)
	if x.MaxTokensPerGPU != 0 {
		check(x.MaxSeqLen >= 1 && SeqRows(x.MaxSeqLen, ms.CP) <= x.MaxTokensPerGPU, "data.max_seq_len %d, max_tokens_per_gpu %d, cp %d", x.MaxSeqLen, x.MaxTokensPerGPU, ms.CP)
	}
	check(finite("data.temperature", x.Temperature) && x.Temperature > 0, "data.temperature = %v", x.Temperature)

	t := s.Train
	within("train.steps", int64(t.Steps), lo, MaxSteps)
	within("train.ppo_epochs", int64(t.PPOEpochs), 1, MaxPPOEpochs)
	within("total updates", s.TotalUpdates(), lo, MaxUpdates)
	check(t.Shuffle || !t.ShuffleGroups, "shuffle_groups without shuffle")
	check(t.Seed >= 0, "train.seed = %d", t.Seed)
	check(finite("train.lr", t.LR) && t.LR > 0, "train.lr = %v", t.LR)
	check(finite("train.min_lr", t.MinLR) && t.MinLR >= 0 && t.MinLR <= t.LR, "train.min_lr = %v, lr %v", t.MinLR, t.LR)
	for i, v := range t.Betas {
		check(v >= 0 && v < 1, "train.betas[%d] = %v", i, v)
	}
	check(finite("train.eps", t.Eps) && t.Eps > 0, "train.eps = %v", t.Eps)
	check(finite("train.weight_decay", t.WeightDecay) && t.WeightDecay >= 0, "train.weight_decay = %v", t.WeightDecay)
	check(finite("train.grad_clip", t.GradClip) && t.GradClip >= 0, "train.grad_clip = %v", t.GradClip)
	within("train.warmup_steps", int64(t.WarmupSteps), 0, MaxUpdates)
	check(finite("train.warmup_init_lr", t.WarmupInitLR) && t.WarmupInitLR >= 0 && t.WarmupInitLR <= t.LR,
		"train.warmup_init_lr = %v, lr %v", t.WarmupInitLR, t.LR)
	check(contains(Decays, t.Decay), "train.decay = %q", t.Decay)
	within("train.decay_steps", int64(t.DecaySteps), lo, MaxUpdates)
	if t.Decay != "constant" && t.DecaySteps != 0 {
		check(t.DecaySteps > t.WarmupSteps, "train.decay_steps %d, warmup_steps %d", t.DecaySteps, t.WarmupSteps)
	}
	within("train.checkpoint_every", int64(t.CheckpointEvery), 0, MaxSteps)

	values, _ := s.Policies.Precision.StringResults()
	for _, v := range values {
		check(contains(Precisions, v), "policies.precision can return %q", v)
	}

	ids := map[string]bool{}
	for _, phase := range []struct {
		p    Phase
		list []*Stage
	}{{Setup, s.Setup}, {Step, s.Step}} {
		for _, st := range phase.list {
			check(stageIDRE.MatchString(st.ID) && !ids[st.ID], "stage id %q invalid or repeated", st.ID)
			ids[st.ID] = true
			check(strings.TrimSpace(st.Uses) != "", "stage %q: uses %q", st.ID, st.Uses)
			check(st.Phase == phase.p, "stage %q: phase %q in %s", st.ID, st.Phase, phase.p)
			for _, r := range st.Needs {
				check(r.Name != "", "stage %q: empty needs", st.ID)
			}
		}
	}

	for _, k := range topKeys {
		check(!valid || !s.Bad(k), "valid spec with bad %s", k)
	}
	return bad
}

// resets gives, for the keys whose values Spec documents, the value a key
// holds in a partial spec when an error is reported about it, and the value
// it should then hold.
var resets = map[string]func(s *Spec) (got, want any){
	"version":                 func(s *Spec) (any, any) { return s.Version, 0 },
	"name":                    func(s *Spec) (any, any) { return s.Name, "" },
	"mesh.nodes":              func(s *Spec) (any, any) { return s.Mesh.Nodes, 1 },
	"mesh.gpus_per_node":      func(s *Spec) (any, any) { return s.Mesh.GPUsPerNode, 1 },
	"mesh.dp":                 func(s *Spec) (any, any) { return s.Mesh.DP, s.Mesh.WorldSize() / s.Mesh.CP },
	"mesh.cp":                 func(s *Spec) (any, any) { return s.Mesh.CP, 1 },
	"mesh.gpu":                func(s *Spec) (any, any) { return s.Mesh.GPU, "" },
	"data.rollouts":           func(s *Spec) (any, any) { return s.Data.Rollouts, "" },
	"data.global_batch_size":  func(s *Spec) (any, any) { return s.Data.GlobalBatchSize, 0 },
	"data.samples_per_prompt": func(s *Spec) (any, any) { return s.Data.SamplesPerPrompt, 1 },
	"data.rollout_batch_size": func(s *Spec) (any, any) {
		return s.Data.RolloutBatchSize, s.Data.GlobalBatchSize / s.Data.SamplesPerPrompt
	},
	"data.max_tokens_per_gpu": func(s *Spec) (any, any) { return s.Data.MaxTokensPerGPU, 0 },
	"data.max_seq_len": func(s *Spec) (any, any) {
		return s.Data.MaxSeqLen, min(MaxSeqFits(s.Data.MaxTokensPerGPU, s.Mesh.CP), MaxTokens)
	},
	"data.temperature":           func(s *Spec) (any, any) { return s.Data.Temperature, 1.0 },
	"train.steps":                func(s *Spec) (any, any) { return s.Train.Steps, 0 },
	"train.ppo_epochs":           func(s *Spec) (any, any) { return s.Train.PPOEpochs, 1 },
	"train.shuffle":              func(s *Spec) (any, any) { return s.Train.Shuffle, false },
	"train.shuffle_groups":       func(s *Spec) (any, any) { return s.Train.ShuffleGroups, false },
	"train.seed":                 func(s *Spec) (any, any) { return s.Train.Seed, int64(1) },
	"train.lr":                   func(s *Spec) (any, any) { return s.Train.LR, 1e-6 },
	"train.min_lr":               func(s *Spec) (any, any) { return s.Train.MinLR, 0.0 },
	"train.betas":                func(s *Spec) (any, any) { return s.Train.Betas, [2]float64{0.9, 0.95} },
	"train.betas[0]":             func(s *Spec) (any, any) { return s.Train.Betas[0], 0.9 },
	"train.betas[1]":             func(s *Spec) (any, any) { return s.Train.Betas[1], 0.95 },
	"train.eps":                  func(s *Spec) (any, any) { return s.Train.Eps, 1e-8 },
	"train.weight_decay":         func(s *Spec) (any, any) { return s.Train.WeightDecay, 0.0 },
	"train.grad_clip":            func(s *Spec) (any, any) { return s.Train.GradClip, 1.0 },
	"train.warmup_steps":         func(s *Spec) (any, any) { return s.Train.WarmupSteps, 0 },
	"train.warmup_init_lr":       func(s *Spec) (any, any) { return s.Train.WarmupInitLR, 0.0 },
	"train.decay":                func(s *Spec) (any, any) { return s.Train.Decay, "constant" },
	"train.decay_steps":          func(s *Spec) (any, any) { return s.Train.DecaySteps, int(s.TotalUpdates()) },
	"train.checkpoint_every":     func(s *Spec) (any, any) { return s.Train.CheckpointEvery, 0 },
	"policies.offload":           func(s *Spec) (any, any) { return s.Policies.Offload, (*Expr)(nil) },
	"policies.offload_optimizer": func(s *Spec) (any, any) { return s.Policies.OffloadOptimizer, (*Expr)(nil) },
	"policies.precision":         func(s *Spec) (any, any) { return s.Policies.Precision, (*Expr)(nil) },
	"policies.recompute":         func(s *Spec) (any, any) { return s.Policies.Recompute, (*Expr)(nil) },
}

// reportedPath returns the dotted path of the key an error message is
// about: the path it starts with ("data.max_seq_len (65) must ...",
// "train.lr: must ..."), or the key a "missing required key" message names.
func reportedPath(msg string) string {
	if section, key, ok := strings.Cut(msg, `missing required key "`); ok {
		key, _, _ = strings.Cut(key, `"`)
		return join(strings.TrimSuffix(section, ": "), key)
	}
	if i := strings.IndexAny(msg, ": "); i > 0 {
		return msg[:i]
	}
	return ""
}

// unreset returns the keys of s that errors es report and that do not hold
// the value resets gives them.
func unreset(s *Spec, es Errors) []string {
	var bad []string
	for _, e := range es {
		if reset, ok := resets[reportedPath(e.Msg)]; ok {
			if got, want := reset(s); !reflect.DeepEqual(got, want) {
				bad = append(bad, fmt.Sprintf("%s = %v after %q, want %v", reportedPath(e.Msg), got, e.Msg, want))
			}
		}
	}
	return bad
}

// snapshot formats every value of s, following pointers, to tell whether
// sanitize changed it.
func snapshot(s *Spec) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %q %q %q\n", s.Version, s.Name, s.File, s.Dir)
	for _, m := range s.Models {
		fmt.Fprintf(&b, "model %+v\n", *m)
	}
	fmt.Fprintf(&b, "%+v\n%+v\n%+v\n", s.Mesh, s.Data, s.Train)
	src := func(e *Expr) string {
		if e == nil {
			return "<nil>"
		}
		return strconv.Quote(e.Src)
	}
	p := s.Policies
	fmt.Fprintf(&b, "policies %s %s %s %s\n", src(p.Offload), src(p.OffloadOptimizer), src(p.Precision), src(p.Recompute))
	for _, st := range append(append([]*Stage(nil), s.Setup...), s.Step...) {
		fmt.Fprintf(&b, "stage %q %q %v %v %s %s %v %v\n", st.ID, st.Uses, st.Needs, st.With != nil, src(st.When), st.Phase, st.Pos, st.UsesPos)
	}
	return b.String()
}

// checkSanitized checks that s, returned by Parse with err, meets the
// invariant, that every key err reports holds its reset value, and that
// sanitize leaves s as it is: a valid spec already
// passes every check sanitize makes, and a partial one is sanitized.
func checkSanitized(t *testing.T, s *Spec, err error) {
	t.Helper()
	problems := invariant(s, err == nil)
	var es Errors
	if errors.As(err, &es) {
		problems = append(problems, unreset(s, es)...)
	}
	if len(problems) > 0 {
		t.Errorf("spec (error %v) breaks the invariant:\n%s", err != nil, strings.Join(problems, "\n"))
	}
	before := snapshot(s)
	if changed := sanitize(s, facts{}); len(changed) > 0 || snapshot(s) != before {
		t.Errorf("sanitize changed %v of a spec (error %v):\n--- before\n%s--- after\n%s", changed, err != nil, before, snapshot(s))
	}
}

// TestPartial checks the partial spec Parse returns with errors: the invalid
// values are replaced by their defaults or zeros, the values that depend on
// them are consistent, the other values are kept, and Bad names the
// sections concerned.
func TestPartial(t *testing.T) {
	tests := []struct {
		name string
		src  string         // top-level sections merged into minimal, or a whole spec after "="
		errs []string       // the errors, by substring
		want map[string]any // path (see valueAt) → value, compared as printed by fmt
		bad  string         // the bad sections
	}{
		{"batch not an integer", "data: {rollouts: r, global_batch_size: x, max_tokens_per_gpu: 64}\n",
			[]string{"data.global_batch_size: want an integer"},
			map[string]any{"Data.GlobalBatchSize": 0, "Data.RolloutBatchSize": 0, "Data.MaxTokensPerGPU": 64, "Data.MaxSeqLen": 64,
				"Data.Rollouts": "r", "Train.Steps": 10, "Train.DecaySteps": 0, "TotalUpdates()": 0}, "data"},
		{"batch zero", "data: {rollouts: r, global_batch_size: 0, max_tokens_per_gpu: 64}\n",
			[]string{"data.global_batch_size: must be at least 1, got 0"},
			map[string]any{"Data.GlobalBatchSize": 0, "Data.RolloutBatchSize": 0, "UpdatesPerStep()": 0}, "data"},
		{"batch missing", "data: {rollouts: r, rollout_batch_size: 4, max_tokens_per_gpu: 64}\n",
			[]string{`data: missing required key "global_batch_size"`},
			map[string]any{"Data.GlobalBatchSize": 0, "Data.RolloutBatchSize": 4, "TotalUpdates()": 0}, "data"},
		{"tokens invalid", "data: {rollouts: r, global_batch_size: 8, max_tokens_per_gpu: 1.5, max_seq_len: 10}\n",
			[]string{"data.max_tokens_per_gpu: want an integer"},
			map[string]any{"Data.MaxTokensPerGPU": 0, "Data.MaxSeqLen": 10, "Data.GlobalBatchSize": 8, "Train.DecaySteps": 10}, "data"},
		{"sequence too long", "data: {rollouts: r, global_batch_size: 8, max_tokens_per_gpu: 64, max_seq_len: 65}\n",
			[]string{"data.max_seq_len (65) must not exceed max_tokens_per_gpu (64)"},
			map[string]any{"Data.MaxTokensPerGPU": 64, "Data.MaxSeqLen": 64}, "data"},
		{"sequence invalid", "data: {rollouts: r, global_batch_size: 8, max_tokens_per_gpu: 64, max_seq_len: -1}\n",
			[]string{"data.max_seq_len: must be at least 1"},
			map[string]any{"Data.MaxSeqLen": 64}, "data"},
		{"batch not a multiple of groups", "data: {rollouts: r, global_batch_size: 12, samples_per_prompt: 8, max_tokens_per_gpu: 64}\n",
			[]string{"data.global_batch_size (12) must be a multiple of samples_per_prompt (8)"},
			map[string]any{"Data.GlobalBatchSize": 0, "Data.SamplesPerPrompt": 8, "Data.RolloutBatchSize": 0, "Train.DecaySteps": 0}, "data"},
		{"rollout not a multiple", "data: {rollouts: r, global_batch_size: 16, samples_per_prompt: 4, rollout_batch_size: 3, max_tokens_per_gpu: 64}\n",
			[]string{"must be a multiple of global_batch_size (16)"},
			map[string]any{"Data.GlobalBatchSize": 16, "Data.RolloutBatchSize": 4, "UpdatesPerStep()": 1, "Train.DecaySteps": 10}, "data train"},
		{"rollout too large", "data: {rollouts: r, global_batch_size: 16, samples_per_prompt: 4, rollout_batch_size: 262145, max_tokens_per_gpu: 64}\n",
			[]string{"samples per step; must be at most 1048576"},
			map[string]any{"Data.RolloutBatchSize": 4, "Data.RolloutSamples()": 16}, "data train"},
		{"rollout with invalid groups", "data: {rollouts: r, global_batch_size: 16, samples_per_prompt: 0, rollout_batch_size: 3, max_tokens_per_gpu: 64}\n",
			[]string{"data.samples_per_prompt: must be at least 1"},
			map[string]any{"Data.SamplesPerPrompt": 1, "Data.GlobalBatchSize": 16, "Data.RolloutBatchSize": 16}, "data train"},
		{"temperature", "data: {rollouts: r, global_batch_size: 8, max_tokens_per_gpu: 64, temperature: 0}\n",
			[]string{"data.temperature: must be greater than 0"},
			map[string]any{"Data.Temperature": 1}, "data"},
		{"empty rollouts", "data: {rollouts: ' ', global_batch_size: 8, max_tokens_per_gpu: 64}\n",
			[]string{"data.rollouts: must not be empty"},
			map[string]any{"Data.Rollouts": "", "Data.GlobalBatchSize": 8}, "data"},
		{"data not a mapping", "data: [1]\n",
			[]string{"data: want a mapping, got a list"},
			map[string]any{"Data.GlobalBatchSize": 0, "Data.MaxTokensPerGPU": 0, "Data.SamplesPerPrompt": 1, "Data.Temperature": 1, "Train.Steps": 10}, "data"},
		{"data missing", "=" + strings.Replace(minimal, "data:\n  rollouts: r.jsonl\n  global_batch_size: 8\n  max_tokens_per_gpu: 1024\n", "", 1),
			[]string{`missing required key "data"`},
			map[string]any{"Data.GlobalBatchSize": 0, "Data.RolloutBatchSize": 0, "Data.MaxSeqLen": 0, "Data.Temperature": 1,
				"Train.Steps": 10, "TotalUpdates()": 0, "Train.DecaySteps": 0, "len(Models)": 1}, "data"},
		{"dp mismatch", "mesh: {nodes: 2, gpus_per_node: 4, dp: 4}\n",
			[]string{"mesh.dp: must equal nodes × gpus_per_node = 8"},
			map[string]any{"Mesh.Nodes": 2, "Mesh.GPUsPerNode": 4, "Mesh.DP": 8, "Data.GlobalBatchSize": 8, "Data.RolloutBatchSize": 8}, "mesh"},
		{"dp mismatch breaks the batch", "mesh: {nodes: 2, gpus_per_node: 4, dp: 4}\ndata: {rollouts: r, global_batch_size: 4, max_tokens_per_gpu: 64}\n",
			[]string{"mesh.dp: must equal nodes × gpus_per_node = 8"},
			map[string]any{"Mesh.DP": 8, "Data.GlobalBatchSize": 0, "Data.RolloutBatchSize": 0, "Train.DecaySteps": 0}, "mesh data train"},
		{"nodes invalid", "mesh: {nodes: 0, gpus_per_node: 2, dp: 4}\n",
			[]string{"mesh.nodes: must be at least 1"},
			map[string]any{"Mesh.Nodes": 1, "Mesh.GPUsPerNode": 2, "Mesh.DP": 2, "Data.GlobalBatchSize": 8}, "mesh"},
		{"nodes invalid and a batch checked against dp", "mesh: {nodes: 0, gpus_per_node: 2, dp: 3}\n",
			[]string{"mesh.nodes: must be at least 1", "data.global_batch_size (8) must be a multiple of mesh.dp (3)"},
			map[string]any{"Mesh.DP": 2, "Data.GlobalBatchSize": 0, "Data.RolloutBatchSize": 0, "Train.DecaySteps": 0}, "mesh data train"},
		{"dp invalid", "mesh: {gpus_per_node: 2, dp: eight}\n",
			[]string{"mesh.dp: want an integer"},
			map[string]any{"Mesh.DP": 2, "Mesh.GPUsPerNode": 2}, "mesh"},
		{"batch not a multiple of dp", "mesh: {gpus_per_node: 3}\n",
			[]string{"data.global_batch_size (8) must be a multiple of mesh.dp (3)"},
			map[string]any{"Mesh.DP": 3, "Data.GlobalBatchSize": 0, "Data.RolloutBatchSize": 0, "Train.DecaySteps": 0}, "data train"},
		{"rollout with invalid batch", "data: {rollouts: r, global_batch_size: 12, samples_per_prompt: 8, rollout_batch_size: 2, max_tokens_per_gpu: 64}\n",
			[]string{"must be a multiple of samples_per_prompt (8)", "16 samples per step must be a multiple of global_batch_size (12)"},
			map[string]any{"Data.GlobalBatchSize": 0, "Data.RolloutBatchSize": 0}, "data"},
		{"gpu zero", "mesh: {gpu: 0}\n", []string{"mesh.gpu: a memory size must be a positive byte count"},
			map[string]any{"Mesh.GPU": ""}, "mesh"},
		{"mesh not a mapping", "mesh: 3\n", []string{"mesh: want a mapping"},
			map[string]any{"Mesh.Nodes": 1, "Mesh.GPUsPerNode": 1, "Mesh.DP": 1}, "mesh"},
		{"steps missing", "train: {lr: 1e-5}\n", []string{`train: missing required key "steps"`},
			map[string]any{"Train.Steps": 0, "Train.LR": 1e-05, "Train.DecaySteps": 0, "TotalUpdates()": 0}, "train"},
		{"too many updates", "data: {rollouts: r, global_batch_size: 1, rollout_batch_size: 4096, max_tokens_per_gpu: 10}\ntrain: {steps: 1048576, decay: linear}\n",
			[]string{"= 4294967296 updates; must be at most 2147483647"},
			map[string]any{"Train.Steps": 0, "Data.RolloutBatchSize": 4096, "Train.DecaySteps": 0, "Train.Decay": "linear"}, "train"},
		{"too many updates, then a batch reset", "mesh: {nodes: 2, gpus_per_node: 4, dp: 4}\ndata: {rollouts: r, global_batch_size: 4, rollout_batch_size: 16384, max_tokens_per_gpu: 10}\ntrain: {steps: 1048576}\n",
			[]string{"mesh.dp: must equal", "= 4294967296 updates; must be at most 2147483647"},
			map[string]any{"Train.Steps": 0, "Data.GlobalBatchSize": 0, "Data.RolloutBatchSize": 16384, "Train.DecaySteps": 0}, "mesh data train"},
		{"warmup covers the run, then a batch reset", "mesh: {nodes: 2, gpus_per_node: 4, dp: 4}\ndata: {rollouts: r, global_batch_size: 4, max_tokens_per_gpu: 10}\ntrain: {steps: 10, warmup_steps: 10, decay: cosine}\n",
			[]string{"mesh.dp: must equal", "train.warmup_steps (10) must be less than decay_steps (10"},
			map[string]any{"Train.WarmupSteps": 0, "Data.GlobalBatchSize": 0, "Train.DecaySteps": 0}, "mesh data train"},
		{"train ranges", "train: {steps: 0, lr: 1e-5, min_lr: 1e-4, eps: 0, weight_decay: -0.1, grad_clip: -1, warmup_steps: -1, decay_steps: -1, checkpoint_every: -2, seed: -1, ppo_epochs: 0, warmup_init_lr: -1}\n",
			[]string{"train.steps: must be at least 1", "min_lr (0.0001) must not exceed lr", "train.eps: must be greater than 0",
				"weight_decay: must not be negative", "grad_clip: must not be negative", "warmup_steps: must be at least 0",
				"decay_steps: must be at least 0", "checkpoint_every: must be at least 0", "train.seed: must be at least 0",
				"train.ppo_epochs: must be at least 1", "warmup_init_lr: must not be negative"},
			map[string]any{"Train.Steps": 0, "Train.LR": 1e-05, "Train.MinLR": 0, "Train.Eps": 1e-08, "Train.WeightDecay": 0, "Train.GradClip": 1,
				"Train.WarmupSteps": 0, "Train.DecaySteps": 0, "Train.CheckpointEvery": 0, "Train.Seed": 1, "Train.PPOEpochs": 1, "Train.WarmupInitLR": 0}, "train"},
		{"lr invalid", "train: {steps: 10, lr: -1, min_lr: 1e-5, warmup_init_lr: 1e-7}\n", []string{"train.lr: must be greater than 0"},
			map[string]any{"Train.LR": 1e-06, "Train.MinLR": 0, "Train.WarmupInitLR": 1e-07}, "train"},
		{"betas", "train: {steps: 10, betas: [0.5, 1.0]}\n", []string{"train.betas[1]: must be in [0, 1)"},
			map[string]any{"Train.Betas": [2]float64{0.5, 0.95}}, "train"},
		{"shuffle groups", "train: {steps: 10, shuffle_groups: true}\n", []string{"train.shuffle_groups: true needs shuffle: true"},
			map[string]any{"Train.ShuffleGroups": false, "Train.Shuffle": false}, "train"},
		{"decay", "train: {steps: 10, decay: Cosine, warmup_steps: 20}\n", []string{`train.decay: want one of`},
			map[string]any{"Train.Decay": "constant", "Train.WarmupSteps": 20, "Train.DecaySteps": 10}, "train"},
		{"warmup covers the run", "train: {steps: 10, warmup_steps: 10, decay: cosine}\n", []string{"train.warmup_steps (10) must be less than decay_steps (10"},
			map[string]any{"Train.WarmupSteps": 0, "Train.DecaySteps": 10, "Train.Decay": "cosine"}, "train"},
		{"decay within warmup", "train: {steps: 10, warmup_steps: 5, decay: linear, decay_steps: 5}\n", []string{"train.decay_steps (5) must exceed warmup_steps (5)"},
			map[string]any{"Train.WarmupSteps": 5, "Train.DecaySteps": 10}, "train"},
		{"decay and its default within warmup", "train: {steps: 10, warmup_steps: 50, decay: linear, decay_steps: 20}\n", []string{"train.decay_steps (20) must exceed warmup_steps (50)"},
			map[string]any{"Train.WarmupSteps": 0, "Train.DecaySteps": 10}, "train"},
		{"explicit decay with unknown updates", "data: {rollouts: r, max_tokens_per_gpu: 64}\ntrain: {steps: 10, warmup_steps: 50, decay: linear, decay_steps: 20}\n",
			[]string{`missing required key "global_batch_size"`, "train.decay_steps (20) must exceed warmup_steps (50)"},
			map[string]any{"Train.WarmupSteps": 50, "Train.DecaySteps": 0}, "data train"},
		{"header", "version: 2\nname: a b\n", []string{"unsupported spec version 2", `name: invalid name "a b"`},
			map[string]any{"Version": 0, "Name": ""}, "version name"},
		{"header types", "version: '1'\nname: 3\n", []string{`version: want an integer, got string "1"`, "name: want a string, got integer 3"},
			map[string]any{"Version": 0, "Name": ""}, "version name"},
		{"models", "models:\n  actor: {path: a}\n  b c: {role: actor, path: b}\n  d: {role: actor, path: d}\n  e: {role: critic, copy_of: actor}\n  f: {role: ref, copy_of: b c}\n  g: {role: ref, copy_of: e}\n  h: {role: ref, path: h, copy_of: actor}\n  i: {role: ref, path: ' '}\n  j: {role: ref, copy_of: zz}\n",
			[]string{`invalid model name "b c"`, "a second actor", `want "actor" or "ref", got "critic"`, `model "e" is itself a copy`,
				"set either path or copy_of, not both", "models.i.path: must not be empty", `unknown model "zz"`, "a second actor"},
			map[string]any{"len(Models)": 8, "Models[0].Name": "actor", "Models[0].Role": "actor", "Models[0].Path": "a",
				"Models[1].Name": "d", "Models[1].Role": "", "Models[1].Path": "d",
				"Models[2].Name": "e", "Models[2].Role": "", "Models[2].CopyOf": "actor",
				"Models[3].Name": "f", "Models[3].Role": "ref", "Models[3].CopyOf": "",
				"Models[4].Name": "g", "Models[4].CopyOf": "",
				"Models[5].Name": "h", "Models[5].Path": "", "Models[5].CopyOf": "",
				"Models[6].Name": "i", "Models[6].Path": "", "Models[7].Name": "j", "Models[7].CopyOf": ""}, "models"},
		{"models not a mapping", "models: [a]\n", []string{"models: want a mapping"}, map[string]any{"len(Models)": 0}, "models"},
		{"model not a mapping", "models:\n  actor: 1\n", []string{"models.actor: want a mapping", "found none"},
			map[string]any{"len(Models)": 1, "Models[0].Name": "actor", "Models[0].Role": "", "Models[0].Path": ""}, "models"},
		{"policies", "policies:\n  offload: 'model.role == \"ref\"'\n  precision: 'layer.is_last ? \"fp16\" : \"bf16\"'\n  recompute: lyr.index > 0\n",
			[]string{`unknown precision "fp16"`, "unknown name lyr"},
			map[string]any{"Policies.Offload.Src": `model.role == "ref"`, "Policies.Precision": nil, "Policies.Recompute": nil}, "policies"},
		{"stages", "stages:\n  setup:\n    - {id: load, uses: load_hf, with: [1]}\n    - {id: Bad, uses: x}\n    - {id: nouses}\n    - {id: blank, uses: ' '}\n  step:\n    - {uses: train}\n    - {id: load, uses: pack}\n    - {id: train, uses: train, needs: [load, Bad, nouses, blank, gone, 3], when: step %}\n",
			[]string{"stages.setup[0].with: want a mapping", `invalid id "Bad"`, `stages.setup[2]: missing required key "uses"`, "stages.setup[3].uses: must not be empty",
				`stages.step[0]: missing required key "id"`, `duplicate stage id "load"`, "stages.step[2].needs[5]: want a stage id", "stages.step[2].when"},
			map[string]any{"len(Setup)": 1, "Setup[0].ID": "load", "Setup[0].Uses": "load_hf", "Setup[0].With": nil,
				"len(Step)": 1, "Step[0].ID": "train", "Step[0].When": nil, "len(Step[0].Needs)": 2, "Step[0].Needs[0].Name": "load", "Step[0].Needs[1].Name": "gone"}, "stages"},
		{"elsewhere", "zzz: 1\n", []string{`unknown key "zzz" at top level`}, map[string]any{"Data.GlobalBatchSize": 8, "Train.DecaySteps": 10}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, whole := strings.CutPrefix(tt.src, "=")
			if !whole {
				src, _ = mergeTop(minimal, tt.src)
			}
			s, err := Parse("dir/p.yaml", []byte(src))
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("err = %v, want Errors; source:\n%s", err, src)
			}
			if len(es) != len(tt.errs) {
				t.Errorf("got %d errors, want %d:\n%v", len(es), len(tt.errs), err)
			}
			for _, w := range tt.errs {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("missing error %q in:\n%v", w, err)
				}
			}
			if s == nil {
				t.Fatalf("no partial spec; source:\n%s", src)
			}
			for path, want := range tt.want {
				got, err := valueAt(s, path)
				if err != nil {
					t.Fatal(err)
				}
				if path == "Data.Rollouts" || strings.HasSuffix(path, ".Path") {
					if w := fmt.Sprint(want); w != "" {
						want = filepath.Join("dir", w)
					}
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("%s = %v, want %v", path, got, want)
				}
			}
			bad := strings.Fields(tt.bad)
			for _, k := range topKeys {
				if s.Bad(k) != contains(bad, k) {
					t.Errorf("Bad(%q) = %v", k, s.Bad(k))
				}
			}
			checkSanitized(t, s, err)
		})
	}
	var nilSpec *Spec
	if nilSpec.Bad("data") {
		t.Error("a nil spec has a bad section")
	}
}

// valueAt returns the value at path in s: field names and methods without
// arguments (written "Name()") separated by dots, each optionally indexed
// ("Models[1]"), or len(path).
func valueAt(s *Spec, path string) (any, error) {
	if inner, ok := strings.CutPrefix(path, "len("); ok {
		v, err := valueAt(s, strings.TrimSuffix(inner, ")"))
		if err != nil {
			return nil, err
		}
		return reflect.ValueOf(v).Len(), nil
	}
	v := reflect.ValueOf(s)
	for _, part := range strings.Split(path, ".") {
		name, index, indexed := strings.Cut(strings.TrimSuffix(part, "]"), "[")
		if method, ok := strings.CutSuffix(name, "()"); ok {
			m := v.MethodByName(method)
			if !m.IsValid() {
				return nil, fmt.Errorf("%s: no method %s", path, method)
			}
			v = m.Call(nil)[0]
		} else {
			for v.Kind() == reflect.Pointer {
				if v.IsNil() {
					return nil, fmt.Errorf("%s: nil before %s", path, name)
				}
				v = v.Elem()
			}
			v = v.FieldByName(name)
			if !v.IsValid() {
				return nil, fmt.Errorf("%s: no field %s", path, name)
			}
		}
		if indexed {
			i, err := strconv.Atoi(index)
			if err != nil || i >= v.Len() {
				return nil, fmt.Errorf("%s: index %s of %d", path, index, v.Len())
			}
			v = v.Index(i)
		}
	}
	if v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, nil
	}
	return v.Interface(), nil
}

// TestPartialRandom checks the invariant on specs drawn at random from
// valid and invalid values of every key, whose checks depend on each other
// in more ways than the cases of TestPartial show.
func TestPartialRandom(t *testing.T) {
	keys := []struct {
		path   string
		values []string // "" leaves the key out
	}{
		{"version", []string{"1", "1", "2", "'1'"}},
		{"name", []string{"t", "t", "a b", ""}},
		{"models", []string{"{actor: {path: m}}", "{actor: {path: m}, ref: {copy_of: actor}}", "{actor: {path: m}, ref: {copy_of: actr}}",
			"{pi: {path: m}, 'b c': {role: actor, path: m}, x: {role: ref, copy_of: 'b c'}}", "{actor: {path: m, copy_of: ref}, ref: {copy_of: actor}}", "[]", ""}},
		{"mesh.nodes", []string{"", "1", "2", "0", "x"}},
		{"mesh.gpus_per_node", []string{"", "1", "3", "4", "65"}},
		{"mesh.dp", []string{"", "", "1", "4", "8", "12", "0"}},
		{"mesh.cp", []string{"", "", "1", "2", "3", "0"}},
		{"mesh.gpu", []string{"", "h100-80g", "0", "' '", "1024"}},
		{"data.rollouts", []string{"r", "r", "' '", "3", ""}},
		{"data.global_batch_size", []string{"", "0", "1", "4", "8", "12", "16", "24", "x"}},
		{"data.samples_per_prompt", []string{"", "", "1", "2", "4", "8", "0"}},
		{"data.rollout_batch_size", []string{"", "", "1", "2", "3", "4", "262145", "1048576"}},
		{"data.max_tokens_per_gpu", []string{"", "10", "64", "64", "0", "1.5"}},
		{"data.max_seq_len", []string{"", "", "8", "64", "65", "0"}},
		{"data.temperature", []string{"", "", "0", "0.7", "-1", ".inf"}},
		{"train.steps", []string{"", "0", "1", "10", "10", "1048576"}},
		{"train.ppo_epochs", []string{"", "", "0", "1", "4", "1024"}},
		{"train.shuffle", []string{"", "true", "false", "yes"}},
		{"train.shuffle_groups", []string{"", "true", "false"}},
		{"train.seed", []string{"", "-1", "0", "5"}},
		{"train.lr", []string{"", "", "1e-5", "-1", "0"}},
		{"train.min_lr", []string{"", "", "0", "1e-6", "1e-4", "-1"}},
		{"train.betas", []string{"", "", "[0.5, 1.0]", "[0.9]", "[0.9, 0.95]", "[-1, x]"}},
		{"train.eps", []string{"", "", "-1", "0", "1e-6"}},
		{"train.weight_decay", []string{"", "", "-1", "0.1"}},
		{"train.grad_clip", []string{"", "", "-1", "0", "0.5"}},
		{"train.warmup_steps", []string{"", "", "0", "5", "10", "100", "-1"}},
		{"train.warmup_init_lr", []string{"", "", "0", "1e-7", "1e-3", "-1"}},
		{"train.decay", []string{"", "constant", "linear", "cosine", "Cosine"}},
		{"train.decay_steps", []string{"", "", "0", "5", "10", "50", "2147483648"}},
		{"train.checkpoint_every", []string{"", "", "0", "5", "-1"}},
		{"policies", []string{"", "", "{precision: 'layer.is_last ? \"fp32\" : \"fp16\"'}", "{precision: '\"bf16\"', recompute: lyr}", "{offload: 'true'}"}},
		{"stages", []string{"", "{step: [{id: a, uses: x}, {id: b, uses: y, needs: [a, c]}, {id: c}]}",
			"{setup: [{id: a, uses: x}], step: [{id: a, uses: x}, {id: B, uses: y}, {id: d, uses: ' ', when: 'step %'}, {id: e, uses: z, needs: [a, d, B]}]}"}},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 3000; i++ {
		// The keys drawn, by top-level key, in order; those of the
		// sections written as keys make a flow mapping.
		drawn := map[string][]string{}
		var order []string
		written := map[string]bool{}
		for _, k := range keys {
			v := k.values[rng.IntN(len(k.values))]
			if v == "" {
				continue
			}
			written[k.path] = true
			top, key, nested := strings.Cut(k.path, ".")
			if _, ok := drawn[top]; !ok {
				order = append(order, top)
			}
			if nested {
				v = key + ": " + v
			}
			drawn[top] = append(drawn[top], v)
		}
		var b strings.Builder
		for _, top := range order {
			if v := drawn[top]; contains([]string{"mesh", "data", "train"}, top) {
				fmt.Fprintf(&b, "%s: {%s}\n", top, strings.Join(v, ", "))
			} else {
				fmt.Fprintf(&b, "%s: %s\n", top, v[0])
			}
		}
		src := b.String()
		s, err := Parse("r.yaml", []byte(src))
		var es Errors
		if err != nil && !errors.As(err, &es) {
			t.Fatalf("err = %v", err)
		}
		if s == nil {
			t.Fatalf("no spec; errors:\n%v\nsource:\n%s", err, src)
		}
		before := t.Failed()
		checkSanitized(t, s, err)
		// Absent keys hold their defaults, computed from the other values.
		for _, path := range []string{"data.rollout_batch_size", "train.decay_steps"} {
			if !written[path] {
				if got, want := resets[path](s); got != want {
					t.Errorf("%s = %v, want its default %v", path, got, want)
				}
			}
		}
		if !before && t.Failed() {
			t.Fatalf("source:\n%s\nerrors:\n%v", src, err)
		}
	}
}

// TestDroppedStages checks that DroppedStages tells a partial spec that
// lost a stage from one whose stages all stayed.
func TestDroppedStages(t *testing.T) {
	for _, tt := range []struct {
		name, stages string
		want         bool
	}{
		{"bad when only", "  step:\n    - {id: a, uses: k, when: 'step %% 2'}\n", false},
		{"invalid id", "  step:\n    - {id: A, uses: k}\n", true},
		{"empty uses", "  step:\n    - {id: a, uses: ''}\n", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src := "version: 1\nname: x\nmodels:\n  actor: {path: m}\ndata: {rollouts: r, global_batch_size: 1, max_tokens_per_gpu: 8}\ntrain: {steps: 1}\nstages:\n" + tt.stages
			s, err := Parse("x.yaml", []byte(src))
			if err == nil || s == nil {
				t.Fatalf("parse: %v, spec %v; want errors and a partial spec", err, s)
			}
			if got := s.DroppedStages(); got != tt.want {
				t.Errorf("DroppedStages() = %v, want %v", got, tt.want)
			}
		})
	}
}
