package spec

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// minimal is the smallest valid spec; tests append to it or edit it.
const minimal = `version: 1
name: t
models:
  actor:
    path: m
data:
  rollouts: r.jsonl
  global_batch_size: 8
  max_tokens_per_gpu: 1024
train:
  steps: 10
`

func TestParseExample(t *testing.T) {
	s, err := Load("testdata/valid/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const file = "testdata/valid/example.yaml"
	dir := filepath.Dir(file)
	if s.Version != 1 || s.Name != "qwen2.5-0.5b-grpo" || s.File != file || s.Dir != dir {
		t.Errorf("header = %d %q %q %q", s.Version, s.Name, s.File, s.Dir)
	}
	wantModels := []Model{
		{Name: "actor", Role: "actor", Path: filepath.Join(dir, "models/qwen2.5-0.5b"), Pos: Pos{file, 4, 3}},
		{Name: "ref", Role: "ref", CopyOf: "actor", Pos: Pos{file, 6, 3}},
	}
	if len(s.Models) != len(wantModels) {
		t.Fatalf("got %d models", len(s.Models))
	}
	for i, m := range s.Models {
		if *m != wantModels[i] {
			t.Errorf("model %d = %+v, want %+v", i, *m, wantModels[i])
		}
	}
	if want := (Mesh{Nodes: 1, GPUsPerNode: 1, DP: 1, CP: 1, GPU: "h100-80g", Pos: Pos{file, 8, 1}}); s.Mesh != want {
		t.Errorf("mesh = %+v, want %+v", s.Mesh, want)
	}
	wantData := Data{Rollouts: filepath.Join(dir, "data/rollouts.jsonl"), GlobalBatchSize: 64, SamplesPerPrompt: 8,
		RolloutBatchSize: 16, MaxTokensPerGPU: 16384, MaxSeqLen: 4096, Temperature: 1, Pos: Pos{file, 13, 1}}
	if s.Data != wantData {
		t.Errorf("data = %+v, want %+v", s.Data, wantData)
	}
	wantTrain := Train{Steps: 100, PPOEpochs: 1, Shuffle: true, ShuffleGroups: true, Seed: 1, LR: 1e-6,
		Betas: [2]float64{0.9, 0.95}, Eps: 1e-8, GradClip: 1, Decay: "constant", DecaySteps: 200, Pos: Pos{file, 22, 1}}
	if s.Train != wantTrain {
		t.Errorf("train = %+v, want %+v", s.Train, wantTrain)
	}
	if b, u, n := s.Data.RolloutSamples(), s.UpdatesPerStep(), s.TotalUpdates(); b != 128 || u != 2 || n != 200 {
		t.Errorf("rollout samples %d, updates per step %d, total updates %d; want 128, 2, 200", b, u, n)
	}
	if got := s.Policies.Precision.Pos; got != (Pos{file, 42, 15}) {
		t.Errorf("precision pos = %v", got)
	}
	if len(s.Setup) != 2 || len(s.Step) != 3 {
		t.Fatalf("stages: %d setup, %d step", len(s.Setup), len(s.Step))
	}
	sync := s.Step[2]
	if sync.ID != "sync_ref" || sync.Uses != "update_ref" || sync.Phase != Step ||
		sync.Pos != (Pos{file, 60, 7}) || sync.UsesPos != (Pos{file, 61, 13}) {
		t.Errorf("sync_ref = %+v", sync)
	}
	if want := []Ref{{"train", Pos{file, 62, 14}}}; !reflect.DeepEqual(sync.Needs, want) {
		t.Errorf("sync_ref needs = %v, want %v", sync.Needs, want)
	}
	if want := []Ref{{"load_actor", Pos{file, 51, 15}}}; !reflect.DeepEqual(s.Setup[1].Needs, want) {
		t.Errorf("shard_actor needs = %v, want %v", s.Setup[1].Needs, want)
	}
	if s.Step[0].With != nil || s.Step[1].With == nil {
		t.Errorf("with: pack %v, train %v", s.Step[0].With, s.Step[1].With)
	}
	for step, want := range map[int]bool{10: true, 11: false, 0: true} {
		got, err := sync.When.Bool(&Env{Step: step})
		if err != nil || got != want {
			t.Errorf("when at step %d = %v, %v; want %v", step, got, err, want)
		}
	}
	prec := func(l LayerEnv) string {
		v, err := s.Policies.Precision.String(&Env{Layer: l})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if prec(LayerEnv{Index: 0}) != "fp32" || prec(LayerEnv{Index: 3}) != "bf16" || prec(LayerEnv{Index: 5, IsLast: true}) != "fp32" {
		t.Error("precision policy evaluates wrongly")
	}
	off, err := s.Policies.Offload.Bool(&Env{Model: ModelEnv{Role: "actor", ParamBytes: 40}, GPU: GPUEnv{MemoryBytes: 100}})
	if err != nil || !off {
		t.Errorf("offload = %v, %v; want true", off, err)
	}
}

func TestParseDefaults(t *testing.T) {
	s, err := Parse("dir/min.yaml", []byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Mesh{Nodes: 1, GPUsPerNode: 1, DP: 1, CP: 1}); s.Mesh != want {
		t.Errorf("mesh = %+v, want %+v", s.Mesh, want)
	}
	d := s.Data
	if d.SamplesPerPrompt != 1 || d.RolloutBatchSize != 8 || d.MaxSeqLen != 1024 || d.Temperature != 1 || d.Rollouts != "dir/r.jsonl" {
		t.Errorf("data defaults = %+v", d)
	}
	tr := s.Train
	if tr.PPOEpochs != 1 || tr.Shuffle || tr.ShuffleGroups || tr.Seed != 1 ||
		tr.LR != 1e-6 || tr.Betas != [2]float64{0.9, 0.95} || tr.Eps != 1e-8 || tr.GradClip != 1 ||
		tr.Decay != "constant" || tr.DecaySteps != 10 || tr.MinLR != 0 || tr.WarmupSteps != 0 || tr.CheckpointEvery != 0 {
		t.Errorf("train defaults = %+v", tr)
	}
	if b, u, n := d.RolloutSamples(), s.UpdatesPerStep(), s.TotalUpdates(); b != 8 || u != 1 || n != 10 {
		t.Errorf("rollout samples %d, updates per step %d, total updates %d; want 8, 1, 10", b, u, n)
	}
	if s.Policies != (Policies{}) || s.Setup != nil || s.Step != nil {
		t.Errorf("policies/stages not empty: %+v %v %v", s.Policies, s.Setup, s.Step)
	}
	// A multi-GPU mesh defaults dp to the world size.
	s, err = Parse("x.yaml", []byte(minimal+"mesh: {nodes: 2, gpus_per_node: 4}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Mesh.DP != 8 || s.Mesh.WorldSize() != 8 {
		t.Errorf("dp = %d, world = %d", s.Mesh.DP, s.Mesh.WorldSize())
	}
	// With cp, dp defaults to the world over cp, and max_seq_len to the
	// longest sequence whose rows on each cp rank fit max_tokens_per_gpu.
	s, err = Parse("x.yaml", []byte(minimal+"mesh: {gpus_per_node: 4, cp: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Mesh.DP != 2 || s.Mesh.CP != 2 || s.Data.MaxSeqLen != 2048 {
		t.Errorf("dp = %d, cp = %d, max_seq_len = %d; want 2, 2, 2048", s.Mesh.DP, s.Mesh.CP, s.Data.MaxSeqLen)
	}
}

func TestSeqRows(t *testing.T) {
	tests := []struct{ n, cp, rows, fits int }{
		{n: 9, cp: 1, rows: 9, fits: 9},
		{n: 9, cp: 2, rows: 6, fits: 16},
		{n: 8, cp: 2, rows: 4, fits: 16},
		{n: 1, cp: 4, rows: 2, fits: 32},
		{n: 17, cp: 4, rows: 6, fits: 64},
	}
	for _, tc := range tests {
		if got := SeqRows(tc.n, tc.cp); got != tc.rows {
			t.Errorf("SeqRows(%d, %d) = %d, want %d", tc.n, tc.cp, got, tc.rows)
		}
		// fits is MaxSeqFits(n, cp): the longest sequence with at most n rows per rank.
		f := MaxSeqFits(tc.n, tc.cp)
		if f != tc.fits && !(tc.n%2 == 1 && tc.cp > 1 && f == tc.cp*(tc.n-1)) {
			t.Errorf("MaxSeqFits(%d, %d) = %d, want %d", tc.n, tc.cp, f, tc.fits)
		}
		if SeqRows(f, tc.cp) > tc.n || SeqRows(f+1, tc.cp) <= tc.n {
			t.Errorf("MaxSeqFits(%d, %d) = %d is not the longest sequence that fits", tc.n, tc.cp, f)
		}
	}
}

func TestParseValid(t *testing.T) {
	tests := []struct {
		name  string
		extra string
		check func(*Spec) bool
	}{
		{"gpu byte count", "mesh: {gpu: 0x10}\n", func(s *Spec) bool { return s.Mesh.GPU == "16" }},
		{"host memory size", "mesh: {host_memory: 2TiB}\n", func(s *Spec) bool { return s.Mesh.HostMemory == 2<<40 }},
		{"host memory bytes", "mesh: {host_memory: 1000000}\n", func(s *Spec) bool { return s.Mesh.HostMemory == 1000000 }},
		{"int where float", "train: {steps: 1, lr: 1, min_lr: 0}\n", nil},
		{"absolute path", "models:\n  actor: {path: /abs/m}\n", func(s *Spec) bool { return s.Models[0].Path == "/abs/m" }},
		{"explicit role", "models:\n  pi: {role: actor, path: m}\n  base: {role: ref, copy_of: pi}\n",
			func(s *Spec) bool { return s.Models[0].Role == "actor" && s.Models[1].Role == "ref" }},
		{"null sections", "mesh:\npolicies:\nstages:\n", nil},
		{"anchors", "x-common: &m {model: actor}\n", nil}, // replaced below
		{"block when", "stages:\n  step:\n    - id: a\n      uses: b\n      when: |\n        step > 2\n", func(s *Spec) bool { return s.Step[0].When.Pos.Line == 17 }},
		{"epochs and rollout batch", "data: {rollouts: r, global_batch_size: 8, samples_per_prompt: 4, rollout_batch_size: 16, max_tokens_per_gpu: 10}\ntrain: {steps: 3, ppo_epochs: 4}\n",
			func(s *Spec) bool {
				return s.UpdatesPerStep() == 32 && s.TotalUpdates() == 96 && s.Train.DecaySteps == 96
			}},
		{"cosine after warmup", "train: {steps: 10, warmup_steps: 9, decay: cosine}\n", func(s *Spec) bool { return s.Train.DecaySteps == 10 }},
		{"warmup past a constant schedule", "train: {steps: 10, warmup_steps: 100}\n", func(s *Spec) bool { return s.Train.WarmupSteps == 100 }},
		{"decay beyond the run", "train: {steps: 10, decay: linear, decay_steps: 1000}\n", func(s *Spec) bool { return s.Train.DecaySteps == 1000 }},
		{"shuffle groups", "train: {steps: 1, shuffle: true, shuffle_groups: true, seed: 0}\n",
			func(s *Spec) bool { return s.Train.Shuffle && s.Train.ShuffleGroups && s.Train.Seed == 0 }},
		{"largest seed", "train: {steps: 1, seed: 9223372036854775807}\n", func(s *Spec) bool { return s.Train.Seed == math.MaxInt64 }},
		{"warmup equal to lr", "train: {steps: 1, lr: 1e-5, warmup_init_lr: 1e-5, warmup_steps: 3}\n", nil},
		{"recompute auto", "policies: {recompute: auto}\n", func(s *Spec) bool { return s.Policies.Recompute == nil }},
		{"recompute written", "policies: {recompute: 'layer.index < 2'}\n", func(s *Spec) bool { return s.Policies.Recompute != nil }},
		{"recompute default", "policies: {offload: 'false'}\n", func(s *Spec) bool { return s.Policies.Recompute == nil }},
		{"alias with", "stages:\n  setup:\n    - {id: a, uses: b, with: &w {model: actor}}\n    - {id: c, uses: d, with: *w}\n",
			func(s *Spec) bool { return s.Setup[1].With != nil && s.Setup[1].With.Kind == 4 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, _ := mergeTop(minimal, tt.extra)
			if tt.name == "anchors" {
				src = strings.Replace(minimal, "path: m", "path: &p m", 1) + "mesh: {gpu: *p}\n"
			}
			s, err := Parse("v.yaml", []byte(src))
			if err != nil {
				t.Fatalf("%s\n%s", err, src)
			}
			if tt.check != nil && !tt.check(s) {
				t.Errorf("check failed for\n%s", src)
			}
		})
	}
}

// mergeTop returns base without its top-level sections that extra also
// has, followed by extra, and the line extra starts at.
func mergeTop(base, extra string) (string, int) {
	keys := map[string]bool{}
	for _, l := range strings.Split(extra, "\n") {
		if l != "" && l[0] != ' ' && l[0] != '#' {
			k, _, _ := strings.Cut(l, ":")
			keys[k] = true
		}
	}
	var b strings.Builder
	skip := false
	lines := 0
	for _, l := range strings.SplitAfter(base, "\n") {
		if l == "" {
			continue
		}
		if l[0] != ' ' {
			k, _, _ := strings.Cut(l, ":")
			skip = keys[k]
		}
		if !skip {
			b.WriteString(l)
			lines++
		}
	}
	b.WriteString(extra)
	return b.String(), lines + 1
}

func TestParseErrors(t *testing.T) {
	type want struct {
		pos string // line:col; for "+" sources, lines count as if the extra sections started at line 12, unless prefixed with "="
		msg string // substring
	}
	tests := []struct {
		name  string
		src   string // full spec, or top-level sections merged into minimal when it starts with "+"
		wants []want
	}{
		{"empty", "", []want{{"1:1", "empty spec"}}},
		{"comment only", "# nothing\n", []want{{"1:1", "empty spec"}}},
		{"not a mapping", "- a\n", []want{{"1:1", "the spec must be a mapping"}}},
		{"syntax", "version: 1\nname: [a\n", []want{{"2:7", "invalid YAML: did not find expected ',' or ']'"}}},
		{"tab", "version: 1\nmesh:\n\tdp: 1\n", []want{{"3:1", "tabs are not allowed"}}},
		{"two documents", minimal + "---\nversion: 1\n", []want{{"13:1", "one YAML document"}}},
		{"missing top", "version: 1\n", []want{
			{"1:1", `missing required key "name"`}, {"1:1", `missing required key "models"`},
			{"1:1", `missing required key "data"`}, {"1:1", `missing required key "train"`}}},
		{"unknown top", "+modles: {}\n", []want{{"12:1", `unknown key "modles" at top level (did you mean "models"?)`}}},
		{"unknown far", "+zzz: 1\n", []want{{"12:1", `(known: version, name, models, mesh, data, train, policies, stages)`}}},
		{"version string", strings.Replace(minimal, "version: 1", `version: "1"`, 1), []want{{"1:10", `version: want an integer, got string "1"`}}},
		{"version 2", strings.Replace(minimal, "version: 1", "version: 2", 1), []want{{"1:10", "unsupported spec version 2"}}},
		{"duplicate top", minimal + "name: u\n", []want{{"12:1", `duplicate key "name" at top level (first at line 2)`}}},
		{"merge key", "+mesh:\n  <<: {dp: 1}\n", []want{{"13:3", "merge keys"}}},
		{"non-string key", "+mesh:\n  [a]: 1\n", []want{{"13:3", "keys must be strings"}}},
		{"mesh wrong type", "+mesh:\n  dp: eight\n", []want{{"13:7", `mesh.dp: want an integer, got string "eight"`}}},
		{"mesh float", "+mesh:\n  nodes: 1.0\n", []want{{"13:10", "mesh.nodes: want an integer, got float 1.0"}}},
		{"mesh dp mismatch", "+mesh:\n  nodes: 2\n  gpus_per_node: 4\n  dp: 4\n", []want{
			{"15:7", "mesh.dp: must equal nodes × gpus_per_node = 8"}}},
		{"mesh cp not dividing", "+mesh:\n  gpus_per_node: 4\n  cp: 3\n", []want{{"14:7", "mesh.cp: must divide nodes × gpus_per_node = 4, got 3"}}},
		{"mesh dp with cp", "+mesh:\n  gpus_per_node: 4\n  cp: 2\n  dp: 4\n", []want{
			{"15:7", "mesh.dp: must equal nodes × gpus_per_node / cp = 4 / 2 = 2"}}},
		{"seq len over cp", strings.Replace(minimal, "max_tokens_per_gpu: 1024", "max_tokens_per_gpu: 1024\n  max_seq_len: 3000", 1) + "mesh: {gpus_per_node: 2, cp: 2}\n",
			[]want{{"10:16", "data.max_seq_len (3000) puts 1500 rows on each of mesh.cp 2 ranks, more than max_tokens_per_gpu (1024): a sample must fit in one micro-batch (at most 2048 tokens)"}}},
		{"batch not multiple of dp", "+mesh:\n  dp: 3\n  gpus_per_node: 3\n", []want{{"=8:22", "global_batch_size (8) must be a multiple of mesh.dp (3)"}}},
		{"mesh zero", "+mesh:\n  nodes: 0\n", []want{{"13:10", "mesh.nodes: must be at least 1, got 0"}}},
		{"mesh gpu", "+mesh:\n  gpu: -5\n", []want{{"13:8", "positive byte count"}}},
		{"mesh host memory", "+mesh:\n  host_memory: lots\n", []want{{"13:16", `mesh.host_memory "lots": want a byte count or a size such as 2TiB`}}},
		{"mesh host memory zero", "+mesh:\n  host_memory: 0\n", []want{{"13:16", "must be positive"}}},
		{"mesh not mapping", "+mesh: 3\n", []want{{"12:7", "mesh: want a mapping, got integer 3"}}},
		{"int overflow", "+mesh:\n  dp: 99999999999999999999\n", []want{{"13:7", "mesh.dp: must be at most 65536, got 99999999999999999999"}}},
		{"models missing role", "+models:\n  pi:\n    path: m\n", []want{
			{"13:3", `models.pi: missing required key "role"`}, {"12:1", "found none"}}},
		{"models bad role", "+models:\n  actor:\n    role: critic\n    path: m\n", []want{
			{"14:11", `want "actor" or "ref", got "critic"`}, {"12:1", "found none"}}},
		{"models two actors", "+models:\n  actor: {path: a}\n  b: {role: actor, path: b}\n", []want{{"14:3", "a second actor"}}},
		{"models neither", "+models:\n  actor: {}\n", []want{{"13:3", `missing required key "path" (or "copy_of")`}}},
		{"models both", "+models:\n  actor: {path: a, copy_of: a}\n", []want{{"13:20", "either path or copy_of"}}},
		{"copy of copy", "+models:\n  actor: {path: a}\n  ref: {copy_of: x}\n  x: {role: ref, copy_of: actor}\n", []want{{"14:18", `model "x" is itself a copy`}}},
		{"copy of self", "+models:\n  actor: {path: a}\n  ref: {copy_of: ref}\n", []want{{"14:18", "copy of itself"}}},
		{"empty path", "+models:\n  actor: {path: ''}\n", []want{{"13:17", "must not be empty"}}},
		{"data missing", "+data:\n  rollouts: r\n", []want{
			{"12:1", `data: missing required key "global_batch_size"`}, {"12:1", `data: missing required key "max_tokens_per_gpu"`}}},
		{"data null", "+data:\n", []want{{"12:1", "global_batch_size"}, {"12:1", "max_tokens_per_gpu"}}},
		{"data prompts empty", "+data:\n  prompts: ' '\n  global_batch_size: 8\n  max_tokens_per_gpu: 10\n", []want{{"13:12", "data.prompts: must not be empty"}}},
		{"data group", "+data:\n  rollouts: r\n  global_batch_size: 12\n  samples_per_prompt: 8\n  max_tokens_per_gpu: 10\n  max_seq_len: 11\n", []want{
			{"15:23", "global_batch_size (12) must be a multiple of samples_per_prompt (8)"},
			{"17:16", "max_seq_len (11) must not exceed max_tokens_per_gpu (10)"}}},
		{"data temperature", "+data:\n  rollouts: r\n  global_batch_size: 8\n  max_tokens_per_gpu: 10\n  temperature: -1\n", []want{{"16:16", "data.temperature: must be greater than 0"}}},
		{"data inf", "+data:\n  rollouts: r\n  global_batch_size: 8\n  max_tokens_per_gpu: 10\n  temperature: .inf\n", []want{{"16:16", "finite"}}},
		{"train ranges", "+train:\n  steps: 0\n  lr: 1e-5\n  min_lr: 1e-4\n  eps: 0\n  weight_decay: -0.1\n  grad_clip: -1\n  warmup_steps: -1\n  decay_steps: -1\n  checkpoint_every: -2\n  seed: -1\n  ppo_epochs: 0\n", []want{
			{"13:10", "train.steps: must be at least 1"}, {"15:11", "min_lr (0.0001) must not exceed lr (1e-05)"},
			{"16:8", "train.eps: must be greater than 0"}, {"17:17", "weight_decay: must not be negative"},
			{"18:14", "grad_clip: must not be negative"}, {"19:17", "warmup_steps: must be at least 0"},
			{"20:16", "decay_steps: must be at least 0"}, {"21:21", "checkpoint_every: must be at least 0"},
			{"22:9", "train.seed: must be at least 0, got -1"}, {"23:15", "train.ppo_epochs: must be at least 1, got 0"}}},
		{"rollout not a multiple", "+data:\n  rollouts: r\n  global_batch_size: 16\n  samples_per_prompt: 4\n  rollout_batch_size: 3\n  max_tokens_per_gpu: 10\n", []want{
			{"16:23", "data.rollout_batch_size: 3 prompt groups × samples_per_prompt (4) = 12 samples per step must be a multiple of global_batch_size (16)"}}},
		{"rollout too large", "+data:\n  rollouts: r\n  global_batch_size: 16\n  samples_per_prompt: 4\n  rollout_batch_size: 262145\n  max_tokens_per_gpu: 10\n", []want{
			{"16:23", "data.rollout_batch_size: 262145 prompt groups × samples_per_prompt (4) = 1048580 samples per step; must be at most 1048576"}}},
		{"rollout type", "+data:\n  rollouts: r\n  global_batch_size: 16\n  rollout_batch_size: all\n  max_tokens_per_gpu: 10\n", []want{
			{"15:23", `data.rollout_batch_size: want an integer, got string "all"`}}},
		{"rollout with bad groups", "+data:\n  rollouts: r\n  global_batch_size: 12\n  samples_per_prompt: 8\n  rollout_batch_size: 2\n  max_tokens_per_gpu: 10\n", []want{
			{"15:23", "global_batch_size (12) must be a multiple of samples_per_prompt (8)"},
			{"16:23", "2 prompt groups × samples_per_prompt (8) = 16 samples per step must be a multiple of global_batch_size (12)"}}},
		{"too many updates", "+data:\n  rollouts: r\n  global_batch_size: 1\n  rollout_batch_size: 4096\n  max_tokens_per_gpu: 10\ntrain:\n  steps: 1048576\n  ppo_epochs: 1\n", []want{
			{"18:10", "train.steps: 1048576 steps × 4096 optimizer updates per step (ppo_epochs × rollout samples / global_batch_size) = 4294967296 updates; must be at most 2147483647"}}},
		{"shuffle groups without shuffle", "+train:\n  steps: 1\n  shuffle_groups: true\n", []want{
			{"14:19", "train.shuffle_groups: true needs shuffle: true (without shuffling, every epoch visits the samples in rollout order)"}}},
		{"shuffle groups with shuffle false", "+train:\n  steps: 1\n  shuffle: false\n  shuffle_groups: true\n", []want{{"15:19", "shuffle_groups: true needs shuffle: true"}}},
		{"shuffle type", "+train:\n  steps: 1\n  shuffle: yes\n  shuffle_groups: true\n", []want{{"14:12", `train.shuffle: want a boolean (true or false), got string "yes"`}}},
		{"shuffle groups type", "+train:\n  steps: 1\n  shuffle_groups: 1\n", []want{{"14:19", "train.shuffle_groups: want a boolean (true or false), got integer 1"}}},
		{"seed too large", "+train:\n  steps: 1\n  seed: 9223372036854775808\n", []want{{"14:9", "train.seed: must be at most 9223372036854775807, got 9223372036854775808"}}},
		{"seed float", "+train:\n  steps: 1\n  seed: 1.5\n", []want{{"14:9", "train.seed: want an integer, got float 1.5"}}},
		{"warmup covers the run", "+train:\n  steps: 10\n  warmup_steps: 10\n  decay: cosine\n", []want{
			{"14:17", "train.warmup_steps (10) must be less than decay_steps (10: by default the run's optimizer updates, steps × updates per step) for cosine decay"}}},
		{"decay within warmup", "+train:\n  steps: 10\n  warmup_steps: 5\n  decay: linear\n  decay_steps: 5\n", []want{
			{"16:16", "train.decay_steps (5) must exceed warmup_steps (5) for linear decay"}}},
		{"warmup above lr", "+train:\n  steps: 10\n  lr: 1e-6\n  warmup_init_lr: 1e-3\n", []want{
			{"15:19", "train.warmup_init_lr (0.001) must not exceed lr (1e-06)"}}},
		{"gpu too large", "+mesh:\n  gpu: 1125899906842625\n", []want{{"13:8", "mesh.gpu: must be at most 1125899906842624, got 1125899906842625"}}},
		{"gpu beyond int64", "+mesh:\n  gpu: 99999999999999999999\n", []want{{"13:8", "mesh.gpu: must be at most 1125899906842624, got 99999999999999999999"}}},
		{"gpu zero", "+mesh:\n  gpu: 0\n", []want{{"13:8", "mesh.gpu: a memory size must be a positive byte count, got 0"}}},
		{"gpus per node overflow", "+mesh:\n  gpus_per_node: 4294967296\n", []want{{"13:18", "mesh.gpus_per_node: must be at most 64, got 4294967296"}}},
		{"tokens overflow", "+data:\n  rollouts: r\n  global_batch_size: 8\n  max_tokens_per_gpu: 9223372036854775807\n", []want{
			{"15:23", "data.max_tokens_per_gpu: must be at most 16777216, got 9223372036854775807"}}},
		{"train betas", "+train:\n  steps: 1\n  betas: [0.9]\n", []want{{"14:10", "want a list of 2 numbers [beta1, beta2], got a list of 1"}}},
		{"train betas type", "+train:\n  steps: 1\n  betas: [a, -0.1]\n", []want{{"14:11", `train.betas[0]: want a number, got string "a"`}, {"14:14", "train.betas[1]: must be in [0, 1)"}}},
		{"train decay", "+train:\n  steps: 1\n  decay: Cosine\n", []want{{"14:10", `want one of "constant", "linear" or "cosine", got "Cosine"`}}},
		{"policy plain", "+policies:\n  offload: model.rol == 1\n", []want{{"13:18", `policies.offload: model has no field rol (did you mean "role"?)`}}},
		{"policy unknown name", "+policies:\n  recompute: \"lyr.index > 0\"\n", []want{{"13:15", `policies.recompute: unknown name lyr (did you mean "layer"?)`}}},
		{"policy escapes", "+policies:\n  recompute: \"\\x6Cayer.kind == lyr\"\n", []want{{"13:32", "unknown name lyr"}}},
		{"policy single quotes", "+policies:\n  precision: 'layer.is_last ? ''fp32'' : ''fp16'''\n", []want{{"13:42", `unknown precision "fp16"`}}},
		{"policy kind", "+policies:\n  precision: 'layer.is_last'\n", []want{{"13:15", "policies.precision: expression must return a string: expected string, but got bool"}}},
		{"policy bool kind", "+policies:\n  offload: '\"yes\"'\n", []want{{"13:13", "policies.offload: expression must return a bool"}}},
		{"policy literal", "+policies:\n  precision: fp16\n", []want{{"13:14", "unknown name fp16"}}},
		{"policy const", "+policies:\n  precision: '\"fp16\"'\n", []want{{"13:15", `unknown precision "fp16" (want "bf16" or "fp32")`}}},
		{"policy literal block", "+policies:\n  precision: |\n    layer.index == 0\n      ? \"fp32\"\n      : lyr\n", []want{{"16:9", "unknown name lyr"}}},
		{"policy folded block", "+policies:\n  recompute: >-\n    layer.index == 0 &&\n    lyr.kind == \"x\"\n", []want{{"15:5", "unknown name lyr"}}},
		{"policy multi-line plain", "+policies:\n  recompute: layer.index == 0 &&\n    lyr.x\n", []want{{"14:5", "unknown name lyr"}}},
		{"policy multi-line quoted", "+policies:\n  recompute: \"layer.index == 0 &&\n\n    lyr.x\"\n", []want{{"15:5", "unknown name lyr"}}},
		{"policy null", "+policies:\n  recompute:\n", []want{{"13:13", "want an expression string, got null"}}},
		{"policy map", "+policies:\n  recompute: {a: 1}\n", []want{{"13:14", "want an expression string, got a mapping"}}},
		{"stages unknown phase", "+stages:\n  steps: []\n", []want{{"13:3", `unknown key "steps" in stages (did you mean "step"?)`}}},
		{"stages not list", "+stages:\n  step: {id: a}\n", []want{{"13:9", "stages.step: want a list of stages, got a mapping"}}},
		{"stage scalar", "+stages:\n  step:\n    - a\n", []want{{"14:7", "stages.step[0]: want a stage"}}},
		{"stage missing", "+stages:\n  step:\n    - when: 'true'\n", []want{
			{"14:7", `stages.step[0]: missing required key "id"`}, {"14:7", `stages.step[0]: missing required key "uses"`}}},
		{"stage fields", "+stages:\n  step:\n    - id: a-b\n      uses: 3\n      needs: {x: 1}\n      with: x\n      when: step\n      need: [a]\n", []want{
			{"14:11", `invalid id "a-b"`}, {"15:13", "stages.step[0].uses: want a string, got integer 3"},
			{"16:14", "stages.step[0].needs: want a stage id or a list of stage ids, got a mapping"},
			{"17:13", "stages.step[0].with: want a mapping of parameters"},
			{"18:13", "stages.step[0].when: expression must return a bool: expected bool, but got int"},
			{"19:7", `unknown key "need" in stages.step[0] (did you mean "needs"?)`}}},
		{"stage dup id across phases", "+stages:\n  setup:\n    - {id: a, uses: x}\n  step:\n    - {id: a, uses: y}\n", []want{{"16:12", `duplicate stage id "a" (first at line 14)`}}},
		{"stage needs list", "+stages:\n  step:\n    - {id: a, uses: x, needs: [b, '', 3]}\n", []want{
			{"14:35", "stages.step[0].needs[1]: must not be empty"}, {"14:39", "stages.step[0].needs[2]: want a stage id"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, shift := tt.src, 0
			if strings.HasPrefix(src, "+") {
				var start int
				src, start = mergeTop(minimal, src[1:])
				shift = start - 12
			}
			s, err := Parse("e.yaml", []byte(src))
			if err == nil {
				t.Fatalf("no error; spec %+v\nsource:\n%s", s, src)
			}
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("error is %T, want Errors", err)
			}
			if parsed := yamlParsed(es); (s != nil) != parsed {
				t.Errorf("spec returned: %v; the YAML parsed: %v", s != nil, parsed)
			}
			if s != nil {
				checkSanitized(t, s, err)
			}
			if len(es) != len(tt.wants) {
				t.Errorf("got %d errors, want %d:\n%v\nsource:\n%s", len(es), len(tt.wants), err, src)
			}
			for _, w := range tt.wants {
				if p, ok := strings.CutPrefix(w.pos, "="); ok {
					w.pos = p
				} else if shift != 0 {
					var l, c int
					fmt.Sscanf(w.pos, "%d:%d", &l, &c)
					w.pos = fmt.Sprintf("%d:%d", l+shift, c)
				}
				found := false
				for _, e := range es {
					if e.Pos.File == "e.yaml" && posLC(e.Pos) == w.pos && strings.Contains(e.Msg, w.msg) {
						found = true
					}
				}
				if !found {
					t.Errorf("missing error %s: %q; got:\n%v\nsource:\n%s", w.pos, w.msg, err, src)
				}
			}
		})
	}
}

func posLC(p Pos) string {
	_, lc, _ := strings.Cut(p.String(), ":")
	return lc
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load("testdata/does-not-exist.yaml")
	if err == nil || err.Error() != "testdata/does-not-exist.yaml: cannot read spec: no such file or directory" {
		t.Errorf("err = %v", err)
	}
}

// TestGolden checks the full error output of the specs under
// testdata/invalid against their .golden files. Run with -update to rewrite.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/invalid/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden inputs: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			_, err := Load(file)
			if err == nil {
				t.Fatal("no error")
			}
			got := err.Error() + "\n"
			golden := strings.TrimSuffix(file, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update)", err)
			}
			if got != string(want) {
				t.Errorf("output differs from %s:\n--- got\n%s--- want\n%s", golden, got, want)
			}
		})
	}
}

// FuzzParse checks that Parse never panics, that every error it reports
// has a position in the file, that it returns a spec exactly when the YAML
// parsed, and that the spec meets the invariant of a valid spec or, with
// errors, of a partial one (see invariant and checkSanitized).
func FuzzParse(f *testing.F) {
	for _, pattern := range []string{"testdata/valid/*.yaml", "testdata/invalid/*.yaml"} {
		files, _ := filepath.Glob(pattern)
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Add([]byte(minimal))
	f.Add([]byte("a: &a [*a]\n"))
	f.Add([]byte("policies: {precision: \"\\u00e9\" }\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("fuzz.yaml", data)
		if err == nil {
			if s == nil {
				t.Fatal("nil spec without error")
			}
			checkSanitized(t, s, nil)
			return
		}
		var es Errors
		if !errors.As(err, &es) || len(es) == 0 {
			t.Fatalf("error %T %v is not a non-empty Errors", err, err)
		}
		for _, e := range es {
			if e.Pos.File != "fuzz.yaml" || e.Pos.Line < 1 || e.Pos.Col < 1 {
				t.Fatalf("error without position: %#v", e)
			}
		}
		_ = err.Error()
		if parsed := yamlParsed(es); (s != nil) != parsed {
			t.Fatalf("spec returned: %v; the YAML parsed: %v; errors:\n%v", s != nil, parsed, err)
		}
		if s != nil {
			checkSanitized(t, s, err)
		}
	})
}
