package spec

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// TestBounds checks every integer key at its bounds: the bounds parse, and
// one past either bound (and a number beyond int64) is an error at the value
// that leaves the key's default, or 0, in the partial spec.
func TestBounds(t *testing.T) {
	// Sections in which every bound of the key below passes the cross-checks.
	const (
		bigData = "data: {rollouts: r, global_batch_size: 1048576, max_tokens_per_gpu: 16777216}\n"
		bigMesh = "mesh: {nodes: 1024, gpus_per_node: 64}\n"
	)
	tests := []struct {
		key     string // dotted path
		context string // sections before the key's own
		lo, hi  string
		get     func(*Spec) int64
		valid   []string // values that parse, default lo and hi
		own     string   // the key's section, which ends with the key; default below
		reset   int64    // the value of the partial spec when the key's value is out of bounds
	}{
		{"mesh.nodes", bigData, "1", "1024", func(s *Spec) int64 { return int64(s.Mesh.Nodes) }, nil, "", 1},
		{"mesh.gpus_per_node", bigData, "1", "64", func(s *Spec) int64 { return int64(s.Mesh.GPUsPerNode) }, nil, "", 1},
		{"mesh.dp", bigData, "1", "65536", func(s *Spec) int64 { return int64(s.Mesh.DP) }, []string{"65536"}, "mesh:\n  nodes: 1024\n  gpus_per_node: 64\n", 65536},
		{"data.global_batch_size", "", "1", "1048576", func(s *Spec) int64 { return int64(s.Data.GlobalBatchSize) }, nil, "", 0},
		{"data.samples_per_prompt", "", "1", "65536", func(s *Spec) int64 { return int64(s.Data.SamplesPerPrompt) }, nil, "", 1},
		{"data.rollout_batch_size", "", "1", "1048576", func(s *Spec) int64 { return int64(s.Data.RolloutBatchSize) }, nil,
			"data:\n  rollouts: r\n  global_batch_size: 1\n  max_tokens_per_gpu: 1\n", 1},
		{"data.max_tokens_per_gpu", "", "1", "16777216", func(s *Spec) int64 { return int64(s.Data.MaxTokensPerGPU) }, nil, "", 0},
		{"data.max_seq_len", "", "1", "16777216", func(s *Spec) int64 { return int64(s.Data.MaxSeqLen) }, nil, "", 16777216},
		{"train.steps", bigMesh + bigData, "1", "1048576", func(s *Spec) int64 { return int64(s.Train.Steps) }, nil, "", 0},
		{"train.ppo_epochs", bigMesh + bigData, "1", "1024", func(s *Spec) int64 { return int64(s.Train.PPOEpochs) }, nil, "", 1},
		{"train.seed", "", "0", "9223372036854775807", func(s *Spec) int64 { return s.Train.Seed }, nil, "", 1},
		{"train.warmup_steps", "", "0", "2147483647", func(s *Spec) int64 { return int64(s.Train.WarmupSteps) }, nil, "", 0},
		{"train.decay_steps", "", "0", "2147483647", func(s *Spec) int64 { return int64(s.Train.DecaySteps) }, []string{"2147483647"}, "", 2},
		{"train.checkpoint_every", "", "0", "1048576", func(s *Spec) int64 { return int64(s.Train.CheckpointEvery) }, nil, "", 0},
		{"mesh.gpu", "", "1", "1125899906842624", func(s *Spec) int64 { v, _ := strconv.ParseInt(s.Mesh.GPU, 10, 64); return v }, nil, "", 0},
	}
	for _, tt := range tests {
		section, key, _ := strings.Cut(tt.key, ".")
		// The section holds the key and what the section needs to be
		// valid with either bound.
		own := tt.own
		if own == "" {
			own = map[string]string{
				"mesh":  "mesh:\n",
				"data":  "data:\n  rollouts: r\n  global_batch_size: 1048576\n  max_tokens_per_gpu: 16777216\n",
				"train": "train:\n  steps: 2\n",
			}[section]
			switch key {
			case "global_batch_size", "max_tokens_per_gpu":
				own = strings.ReplaceAll(own, "  "+key+": "+map[string]string{"global_batch_size": "1048576", "max_tokens_per_gpu": "16777216"}[key]+"\n", "")
			case "steps":
				own = "train:\n"
			}
		}
		if tt.valid == nil {
			tt.valid = []string{tt.lo, tt.hi}
		}
		src, _ := mergeTop(minimal, tt.context+own)
		src += "  " + key + ": %s\n"
		line := strings.Count(src, "\n")
		col := len("  "+key+": ") + 1
		lo, _ := strconv.ParseInt(tt.lo, 10, 64)
		hi, _ := strconv.ParseInt(tt.hi, 10, 64)
		t.Run(tt.key, func(t *testing.T) {
			for _, v := range tt.valid {
				s, err := Parse("b.yaml", []byte(fmt.Sprintf(src, v)))
				if err != nil {
					t.Fatalf("%s: %s: %v", tt.key, v, err)
				}
				if got := strconv.FormatInt(tt.get(s), 10); got != v {
					t.Errorf("%s: %s decoded as %s", tt.key, v, got)
				}
			}
			below := strconv.FormatInt(lo-1, 10)
			above := "9223372036854775808"
			if hi < 1<<62 {
				above = strconv.FormatInt(hi+1, 10)
			}
			for _, c := range []struct{ v, msg string }{
				{above, fmt.Sprintf("%s: must be at most %d, got %s", tt.key, hi, above)},
				{"99999999999999999999", fmt.Sprintf("%s: must be at most %d, got 99999999999999999999", tt.key, hi)},
				{below, fmt.Sprintf("%s: must be at least %d, got %s", tt.key, lo, below)},
				{"-99999999999999999999", fmt.Sprintf("%s: must be at least %d, got -99999999999999999999", tt.key, lo)},
			} {
				if tt.key == "mesh.gpu" && (c.v == below || strings.HasPrefix(c.v, "-")) {
					continue // "a memory size must be a positive byte count", checked by TestParseErrors
				}
				s, err := Parse("b.yaml", []byte(fmt.Sprintf(src, c.v)))
				var es Errors
				if !errors.As(err, &es) || len(es) != 1 {
					t.Errorf("%s: %s: want one error, got %v", tt.key, c.v, err)
					continue
				}
				if s == nil {
					t.Errorf("%s: %s: no partial spec", tt.key, c.v)
				} else if got := tt.get(s); got != tt.reset {
					t.Errorf("%s: %s: the partial spec holds %d, want %d", tt.key, c.v, got, tt.reset)
				}
				if want := fmt.Sprintf("b.yaml:%d:%d: %s", line, col, c.msg); es[0].Error() != want {
					t.Errorf("got  %s\nwant %s", es[0].Error(), want)
				}
			}
		})
	}
}

// TestTrainingStep checks the rollout batch, the optimizer updates per step
// and of the run, and the default length of the decay.
func TestTrainingStep(t *testing.T) {
	tests := []struct {
		data, train        string // keys added to data: and train:
		rollout, samples   int
		perStep, decaySize int
		total              int64
	}{
		{"", "", 8, 8, 1, 10, 10},
		{"samples_per_prompt: 4", "", 2, 8, 1, 10, 10},
		{"samples_per_prompt: 4, rollout_batch_size: 4", "", 4, 16, 2, 20, 20},
		{"samples_per_prompt: 4, rollout_batch_size: 4", "ppo_epochs: 3", 4, 16, 6, 60, 60},
		{"rollout_batch_size: 24", "ppo_epochs: 2", 24, 24, 6, 60, 60},
		{"", "ppo_epochs: 5, decay_steps: 7", 8, 8, 5, 7, 50},
	}
	for _, tt := range tests {
		src := strings.Replace(minimal, "  max_tokens_per_gpu: 1024\n", "  max_tokens_per_gpu: 1024\n  "+strings.ReplaceAll(tt.data, ", ", "\n  ")+"\n", 1)
		src += "  " + strings.ReplaceAll(tt.train, ", ", "\n  ") + "\n"
		s, err := Parse("s.yaml", []byte(src))
		if err != nil {
			t.Errorf("%s\n%s", err, src)
			continue
		}
		if s.Data.RolloutBatchSize != tt.rollout || s.Data.RolloutSamples() != tt.samples || s.UpdatesPerStep() != tt.perStep ||
			s.TotalUpdates() != tt.total || s.Train.DecaySteps != tt.decaySize {
			t.Errorf("%q %q: rollout batch %d, samples %d, updates per step %d, total %d, decay steps %d; want %d %d %d %d %d",
				tt.data, tt.train, s.Data.RolloutBatchSize, s.Data.RolloutSamples(), s.UpdatesPerStep(), s.TotalUpdates(), s.Train.DecaySteps,
				tt.rollout, tt.samples, tt.perStep, tt.total, tt.decaySize)
		}
	}
	var zero Spec
	if zero.UpdatesPerStep() != 0 || zero.TotalUpdates() != 0 {
		t.Error("a zero Spec has optimizer updates")
	}
}
