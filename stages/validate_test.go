package stages

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/spec"
)

// resolveErrors resolves s for a run and returns the first line of every
// error (expression errors continue with a snippet).
func resolveErrors(t *testing.T, s *spec.Spec) []string {
	t.Helper()
	_, err := Resolve(s, testGPU, CheckRun)
	if err == nil {
		return nil
	}
	var out []string
	for _, e := range err.(spec.Errors) {
		out = append(out, strings.SplitN(e.Error(), "\n", 2)[0])
	}
	return out
}

// TestValidateRecipe holds the recipe mistakes that used to validate and
// then run wrongly, panic or fail late to errors at their positions, in
// one pass; and the reorderings that are not mistakes to plans that run in
// the order the data needs.
func TestValidateRecipe(t *testing.T) {
	const f = "../examples/tiny-grpo.yaml"
	tests := []struct {
		name  string
		edits []string
		want  []string
	}{
		{
			name:  "old log-probs computed every other step",
			edits: []string{"      needs: pack\n      with: {chunk_tokens: 256}\n    - id: train", "      needs: pack\n      when: step % 2 == 1\n    - id: train"},
			want:  []string{f + `:61:7: stage "train" reads old_logp.logp, but at step 2 "old_logp" does not run (when: step % 2 == 1) and "train" does (it has no when)`},
		},
		{
			name:  "reference log-probs forced after train",
			edits: []string{"      uses: ref_logprob\n      needs: pack", "      uses: ref_logprob\n      needs: train"},
			want:  []string{f + `:55:14: dependency cycle: ref_logp -> train -> ref_logp (each stage needs the next)`},
		},
		{
			name:  "old log-probs after the update",
			edits: []string{"      uses: actor_logprob\n      needs: pack", "      uses: actor_logprob\n      needs: sync_ref", "needs: [ref_logp, old_logp]", "needs: [ref_logp]"},
			want:  []string{f + `:59:14: dependency cycle: old_logp -> sync_ref -> train -> old_logp (old_logp needs sync_ref; sync_ref needs train; train writes weights/actor, which old_logp reads as it is when the step starts)`},
		},
		{
			name:  "a policy that fails for some layer",
			edits: []string{"recompute: 'layer.index % 2 == 0'", "recompute: 'layer.index % 0 == 0'"},
			want:  []string{f + `:36:15: policies.recompute for layer 0 of model "actor" in stage "shard_actor": evaluating "layer.index % 0 == 0": runtime error: integer divide by zero (1:13)`},
		},
		{
			name:  "an element-wise policy that fails for some layer",
			edits: []string{"recompute: 'layer.index % 2 == 0'", "recompute: 'layer.index % 2 == 0'\n  recompute_elementwise: 'layer.index % 0 == 1'"},
			want:  []string{f + `:37:27: policies.recompute_elementwise for layer 0 of model "actor" in stage "shard_actor": evaluating "layer.index % 0 == 1": runtime error: integer divide by zero (1:13)`},
		},
		{
			name:  "several updates per step without old log-probs",
			edits: []string{"  checkpoint_every: 6\n", "  checkpoint_every: 6\n  ppo_epochs: 2\n", "    - id: old_logp\n      uses: actor_logprob\n      needs: pack\n      with: {chunk_tokens: 256}\n", "", "needs: [ref_logp, old_logp]", "needs: [ref_logp]"},
			want:  []string{f + `:59:13: stage "train" makes 2 updates per step (train.ppo_epochs 2 × 1 mini-batches of data.global_batch_size 64 in a rollout batch of 64): the ratio needs the log-probs from before the step's first update; add an actor_logprob stage, or set use_rollout_log_probs`},
		},
		{
			name:  "a KL term without reference log-probs",
			edits: []string{"    - id: ref_logp\n      uses: ref_logprob\n      needs: pack\n      with: {chunk_tokens: 256}\n", "", "needs: [ref_logp, old_logp]", "needs: [old_logp]"},
			want:  []string{f + `:58:13: stage "train" input "ref" (log_probs/ref): no stage produces it (a ref_logprob stage produces it)`},
		},
		{
			name:  "rollout log-probs the file does not have",
			edits: []string{"        entropy_coef: 0.001", "        entropy_coef: 0.001\n        tis: truncate"},
			want:  []string{f + `:20:13: data.rollouts: ../examples/data/tiny-rollouts.jsonl has no rollout_log_probs, which stage "train" (tis: truncate) needs`},
		},
		{
			name:  "a named producer that does not exist",
			edits: []string{"        entropy_coef: 0.001", "        entropy_coef: 0.001\n        old: old_lgp"},
			want:  []string{f + `:71:14: stage "train" input "old" (log_probs/old): no stage "old_lgp" (did you mean "old_logp"?)`},
		},
		{
			name: "problems of every layer at once",
			edits: []string{
				"recompute: 'layer.index % 2 == 0'", "recompute: 'layer.index % 0 == 0'",
				"      with: {chunk_tokens: 256}\n    - id: old_logp", "      with: {chunk_tokens: 0}\n    - id: old_logp",
				"        kl_coef: 0.01", "        kl_coef: -1",
			},
			want: []string{
				f + `:36:15: policies.recompute for layer 0 of model "actor" in stage "shard_actor": evaluating "layer.index % 0 == 0": runtime error: integer divide by zero (1:13)`,
				f + `:56:28: stage "ref_logp": chunk_tokens must be auto or in [1, 16777216], got 0`,
				f + `:69:18: stage "train": kl_coef: -1 must be finite and >= 0`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := resolveErrors(t, variant(t, filepath.Join("..", "examples", "tiny-grpo.yaml"), tt.edits...))
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

// TestValidateRolloutFile checks the rollout file at validate time: every
// problem at its line of the file, and the batch arithmetic at the spec's
// rollouts value.
func TestValidateRolloutFile(t *testing.T) {
	src := filepath.Join("..", "examples", "data", "tiny-rollouts.jsonl")
	lines := strings.SplitAfter(readFile(t, src), "\n")
	tests := []struct {
		name  string
		rows  func() []string
		want  []string
		extra []string // spec edits
	}{
		{
			name: "tokens outside the vocabulary, too long, and a broken line",
			rows: func() []string {
				r := append([]string(nil), lines...)
				r[3] = strings.Replace(r[3], `"prompt_tokens":[`, `"prompt_tokens":[999,`, 1)
				r[9] = strings.Replace(r[9], `"response_tokens":[`, `"response_tokens":[1,2,3,`, 1)
				r[12] = "{\"prompt_tokens\":[1,2\n"
				return r
			},
			want: []string{
				"ROLLOUTS:4:1: sample 3: tokens[0]: 999 is outside the vocabulary of 256",
				"ROLLOUTS:4:1: sample 3 has 25 tokens, more than data.max_seq_len 24",
				// Line 13 did not decode, so its group has a sample too few.
				"ROLLOUTS:9:1: group 1 (first sample 8) has 7 samples, want samples_per_prompt 8",
				"ROLLOUTS:10:1: sample 9 has 27 tokens, more than data.max_seq_len 24",
				"ROLLOUTS:13:1: invalid JSON: unexpected end of line",
			},
		},
		{
			name: "not a whole number of rollout batches",
			rows: func() []string { return lines[:72] },
			want: []string{`SPEC:20:13: data.rollouts: ROLLOUTS holds 72 samples, not a whole number of rollout batches of 64 (rollout_batch_size 8 × samples_per_prompt 8): 8 left over`},
		},
		{
			name: "a group split between rollout batches",
			rows: func() []string {
				r := append([]string(nil), lines...)
				r[63], r[64] = r[64], r[63]
				return r
			},
			want: []string{
				"ROLLOUTS:65:1: group 7 has samples in rollout batches 1 and 2: a step's advantages are computed over whole groups, so a group's samples belong in one rollout batch",
				"ROLLOUTS:66:1: group 8 has samples in rollout batches 1 and 2: a step's advantages are computed over whole groups, so a group's samples belong in one rollout batch",
			},
		},
		{
			name: "a UTF-8 byte order mark is fine",
			rows: func() []string {
				r := append([]string(nil), lines...)
				r[0] = "\xef\xbb\xbf" + r[0]
				return r
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.Symlink(mustAbs(t, filepath.Join("..", "examples", "models")), filepath.Join(dir, "models")); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(dir, "data"), 0o755); err != nil {
				t.Fatal(err)
			}
			rollouts := filepath.Join(dir, "data", "tiny-rollouts.jsonl")
			if err := os.WriteFile(rollouts, []byte(strings.Join(tt.rows(), "")), 0o644); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "tiny.yaml")
			if err := os.WriteFile(path, []byte(readFile(t, filepath.Join("..", "examples", "tiny-grpo.yaml"))), 0o644); err != nil {
				t.Fatal(err)
			}
			s, err := spec.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			got := resolveErrors(t, s)
			for i, w := range tt.want {
				w = strings.ReplaceAll(w, "ROLLOUTS", rollouts)
				tt.want[i] = strings.ReplaceAll(w, "SPEC", path)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tt.want[i]) {
					t.Errorf("error %d: %s\nwant: %s", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestReorderedRecipes checks recipes whose stages are listed out of data
// order with needs dropped: the data edges order them, and they run.
func TestReorderedRecipes(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	tests := []struct {
		name  string
		edits []string
	}{
		{"ref_logp listed after train, needs dropped", []string{
			"    - id: ref_logp\n      uses: ref_logprob\n      needs: pack\n      with: {chunk_tokens: 256}\n", "",
			"      when: step % 6 == 0\n", "      when: step % 6 == 0\n    - id: ref_logp\n      uses: ref_logprob\n      with: {chunk_tokens: 256}\n",
			"needs: [ref_logp, old_logp]", "needs: [old_logp]",
		}},
		{"train listed first with no needs", []string{
			"  step:\n    - id: pack", "  step:\n    - id: train\n      uses: train\n      with: {chunk_tokens: 256, kl: low_var_kl, kl_coef: 0.01}\n    - id: pack",
			"    - id: train\n      uses: train\n      needs: [ref_logp, old_logp]\n      with:\n        chunk_tokens: 256\n        eps_clip: 0.2\n        eps_clip_high: 0.28\n        kl: low_var_kl\n        kl_coef: 0.01\n        entropy_coef: 0.001\n", "",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := variant(t, path, tt.edits...)
			out := runParsed(t, s, func(s *spec.Spec) { s.Train.Steps = 2 }, func(j *Job) {
				at := map[string]int{}
				for i, n := range j.Graph.Order(spec.Step) {
					at[n.Stage.ID] = i
				}
				if !(at["pack"] < at["ref_logp"] && at["ref_logp"] < at["train"] && at["old_logp"] < at["train"] && at["train"] < at["sync_ref"]) {
					t.Errorf("step order %v", at)
				}
			}, RunOptions{})
			if len(out.steps) != 2 || out.steps[0].Stats.Values["kl_loss"] != 0 {
				t.Errorf("steps %d, step 1 kl %v (the ref equals the actor: 0)", len(out.steps), out.steps[0].Stats.Values["kl_loss"])
			}
		})
	}
}
