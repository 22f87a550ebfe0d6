package stages

import (
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/rlpipe/rlpipe/spec"
)

// liveRun is what a run of the live recipe shows: rank 0's steps and, per
// step, the rollouts generate wrote and the old log-probs of the batch.
type liveRun struct {
	steps    []StepResult
	rollouts map[int]*RolloutBatch
	batches  map[int]*Batch
	old      map[int]*TokenValues
}

func runLive(t *testing.T, s *spec.Spec, dp int) *liveRun {
	t.Helper()
	s.Mesh.GPUsPerNode, s.Mesh.DP = dp, dp
	out := &liveRun{rollouts: map[int]*RolloutBatch{}, batches: map[int]*Batch{}, old: map[int]*TokenValues{}}
	var mu sync.Mutex
	runParsed(t, s, nil, nil, RunOptions{AfterStep: func(r *Rank, sr StepResult) error {
		if r.ID != 0 {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		out.steps = append(out.steps, sr)
		out.rollouts[sr.Step] = r.Output("generate", "rollouts").(*RolloutBatch)
		out.batches[sr.Step] = r.Output("pack", "batch").(*Batch)
		out.old[sr.Step] = r.Output("old_logp", "logp").(*TokenValues)
		return nil
	}})
	return out
}

var livePath = filepath.Join("..", "examples", "tiny-live.yaml")

// TestLiveLoop runs the embedded default, a live loop on the local engine:
// every step generates fresh rollouts of the current policy (8 responses
// to each of 8 prompts, of 16 tokens), their reward rises over the run, the
// engine's log-probs are the actor's (what actor_logprob computes of the
// same weights) within float32 rounding, and the same seed gives the same
// rollouts while another seed does not.
func TestLiveLoop(t *testing.T) {
	r := runLive(t, variant(t, livePath), 1)
	if len(r.steps) != 12 {
		t.Fatalf("%d steps, want 12", len(r.steps))
	}
	var first, last float64
	for i, sr := range r.steps {
		rb := r.rollouts[sr.Step]
		if len(rb.Samples) != 64 {
			t.Fatalf("step %d: %d rollouts, want 64", sr.Step, len(rb.Samples))
		}
		for k, sm := range rb.Samples {
			if sm.ResponseLength != 16 || len(sm.RolloutLogProbs) != 16 || sm.PromptLength() != 8 {
				t.Fatalf("step %d sample %d: %d prompt and %d response tokens, %d log-probs", sr.Step, k, sm.PromptLength(), sm.ResponseLength, len(sm.RolloutLogProbs))
			}
		}
		// The engine sampled with the weights actor_logprob read.
		b, old := r.batches[sr.Step], r.old[sr.Step]
		for k, sm := range b.Samples {
			for j, lp := range sm.RolloutLogProbs {
				if d := lp - old.Values[b.RespOff[k]+j]; d > 1e-5 || d < -1e-5 {
					t.Fatalf("step %d sample %d token %d: engine log-prob %v, actor_logprob %v", sr.Step, k, j, lp, old.Values[b.RespOff[k]+j])
				}
			}
		}
		v := sr.Stats.Values["reward_mean"]
		switch {
		case i < 3:
			first += v / 3
		case i >= 9:
			last += v / 3
		}
	}
	if !(last > first+0.05) {
		t.Errorf("reward_mean over the first 3 steps %.4f, over the last 3 %.4f: the policy did not learn the reward", first, last)
	}
	// The first two steps again: the schedule of the 12-step run.
	again := runLive(t, variant(t, livePath, "  steps: 12\n", "  steps: 2\n  decay_steps: 12\n"), 1)
	other := runLive(t, variant(t, livePath, "  steps: 12\n", "  steps: 2\n  decay_steps: 12\n  seed: 2\n"), 1)
	for step := 1; step <= 2; step++ {
		if !reflect.DeepEqual(again.rollouts[step], r.rollouts[step]) {
			t.Errorf("step %d: the same seed generated other rollouts", step)
		}
		if reflect.DeepEqual(other.rollouts[step].Samples[0].Tokens, r.rollouts[step].Samples[0].Tokens) {
			t.Errorf("step %d: seeds 1 and 2 generated the same first sample", step)
		}
	}
}

// TestLiveLoopRanks generates on 2 loopback ranks, each sampling its share
// in lockstep: the first step's rollouts (same weights) are those of one
// rank, token for token.
func TestLiveLoopRanks(t *testing.T) {
	two := variant(t, livePath, "  steps: 12\n", "  steps: 2\n  decay_steps: 12\n")
	one := runLive(t, variant(t, livePath, "  steps: 12\n", "  steps: 1\n  decay_steps: 12\n"), 1)
	r := runLive(t, two, 2)
	if len(r.steps) != 2 {
		t.Fatalf("%d steps on 2 ranks, want 2", len(r.steps))
	}
	if !reflect.DeepEqual(r.rollouts[1], one.rollouts[1]) {
		t.Error("2 ranks generated other rollouts than 1 from the same weights")
	}
}

const syncRef = "    - {id: sync_ref, uses: update_ref, when: step % 6 == 0}\n"

func TestValidateGenerate(t *testing.T) {
	const f = "../examples/tiny-live.yaml"
	tests := []struct {
		name  string
		edits []string
		want  []string
	}{
		{"no engine", []string{"        engine: local\n", ""}, []string{f + `:48:13: stage "generate": engine is required: local, sglang or openai`}},
		{"bad url", []string{"        engine: local\n", "        engine: sglang\n        url: localhost:30000\n"}, []string{f + `:51:14: stage "generate": the sglang engine needs url: an http or https base URL such as http://127.0.0.1:30000, got "localhost:30000"`}},
		{"reward expression", []string{"count(response, # < 64)", "count(respons, # < 64)"}, []string{f + `:52:31: stage "generate": reward.expr: unknown name respons (did you mean response?)`}},
		{"too many new tokens", []string{"max_new_tokens: 16", "max_new_tokens: 17"}, []string{f + `:51:25: stage "generate": the longest prompt (8 tokens) and max_new_tokens 17 exceed data.max_seq_len 24`}},
		{"no prompts file", []string{"  prompts: data/tiny-prompts.jsonl\n", ""}, []string{f + `:22:1: data: a generate stage reads the prompts, and data.prompts names no file`}},
		{"push into a directory", []string{syncRef, syncRef + "    - {id: push, uses: push_weights, with: {dir: data}}\n"}, []string{f + `:60:50: stage "push": ../examples/data exists and is not the link push_weights keeps to its latest version; name a new path`}},
		{"push without engine", []string{syncRef, syncRef + "    - {id: push, uses: push_weights, with: {dir: policy, url: 'http://h:1'}}\n"}, []string{f + `:60:63: stage "push": url names an engine, but engine is not set (sglang or openai)`}},
		{"prompts and rollouts", []string{"  prompts: data/tiny-prompts.jsonl\n", "  prompts: data/tiny-prompts.jsonl\n  rollouts: data/tiny-rollouts.jsonl\n"}, []string{f + `:24:13: data.rollouts: no stage reads the rollout file (another stage produces the rollouts)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := resolveErrors(t, variant(t, livePath, tt.edits...))
			if len(got) != len(tt.want) {
				t.Fatalf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tt.want[i]) {
					t.Errorf("error %d:\n%s\nwant:\n%s", i, got[i], tt.want[i])
				}
			}
		})
	}
}
