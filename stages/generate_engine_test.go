package stages

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages/engines"
	"github.com/rlpipe/rlpipe/stages/engines/enginetest"
)

// fakePolicy is the test engines' sampler for the tiny model.
var fakePolicy = enginetest.SmallVocab

// liveOn is the live recipe with its generate stage on an HTTP engine at
// url, run for steps steps of the 12-step schedule.
func liveOn(t *testing.T, engine, url string, steps int, edits ...string) *spec.Spec {
	t.Helper()
	base := []string{
		"        engine: local\n", "        engine: " + engine + "\n        url: " + url + "\n        retries: 0\n",
		"  steps: 12\n", "  steps: " + strconv.Itoa(steps) + "\n  decay_steps: 12\n",
	}
	return variant(t, livePath, append(base, edits...)...)
}

// runErr resolves, plans and runs s and returns the run's error.
func runErr(t *testing.T, s *spec.Spec) error {
	t.Helper()
	j := resolveSpec(t, s)
	p, err := Plan(j)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), j, p, RunOptions{})
	return err
}

// TestGenerateEngine runs the live loop with its rollouts from an SGLang
// and a vLLM (OpenAI API) test engine: each step's rollouts are the prompts
// followed by exactly the tokens and log-probs the engine answered, the
// rewards and length metrics are those of these responses, the requests
// carry the recipe's sampling parameters and a fresh seed each step, and
// 2 ranks train on the same rollouts as 1.
func TestGenerateEngine(t *testing.T) {
	prompts, err := readPrompts(t)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		engine, path string
		perStep      int // requests per step: one per sample (SGLang), one per prompt (OpenAI)
	}{
		{EngineSGLang, "/generate", 64},
		{EngineOpenAI, "/v1/completions", 8},
	} {
		t.Run(tt.engine, func(t *testing.T) {
			var srv *enginetest.Server
			if tt.engine == EngineSGLang {
				srv = enginetest.NewSGLang(fakePolicy)
			} else {
				srv = enginetest.NewOpenAI(fakePolicy)
			}
			defer srv.Close()
			r := runLive(t, liveOn(t, tt.engine, srv.URL, 2), 1)
			if len(r.steps) != 2 {
				t.Fatalf("%d steps, want 2", len(r.steps))
			}
			for _, sr := range r.steps {
				rb := r.rollouts[sr.Step]
				if len(rb.Samples) != 64 {
					t.Fatalf("step %d: %d rollouts, want 64", sr.Step, len(rb.Samples))
				}
				var reward, length float64
				for k, sm := range rb.Samples {
					// Steps draw the prompts in file order, 8 at a time.
					pr := prompts[((sr.Step-1)*8+k/8)%len(prompts)]
					// SGLang is asked once per sample, vLLM once per prompt
					// for all 8.
					want := fakePolicy(pr, 8, engines.Params{MaxNewTokens: 16})[k%8]
					if tt.engine == EngineSGLang {
						want = fakePolicy(pr, 1, engines.Params{MaxNewTokens: 16})[0]
					}
					if !reflect.DeepEqual(sm.Tokens[:len(pr)], pr) || !reflect.DeepEqual(sm.Response(), want.Tokens) || !reflect.DeepEqual(sm.RolloutLogProbs, want.LogProbs) {
						t.Fatalf("step %d sample %d: tokens %v, log-probs %v; want prompt %v, response %v, log-probs %v", sr.Step, k, sm.Tokens, sm.RolloutLogProbs, pr, want.Tokens, want.LogProbs)
					}
					low := 0
					for _, tok := range want.Tokens {
						if tok < 64 {
							low++
						}
					}
					reward += float64(low) / float64(len(want.Tokens)) / 64
					length += float64(len(want.Tokens)) / 64
				}
				if got := sr.Stats.Values["reward_mean"]; !near(got, reward, 1e-6) {
					t.Errorf("step %d: reward_mean %v, want %v", sr.Step, got, reward)
				}
				if got := sr.Stats.Values["response_length_mean"]; !near(got, length, 1e-9) {
					t.Errorf("step %d: response_length_mean %v, want %v", sr.Step, got, length)
				}
			}
			reqs := srv.Requests(tt.path)
			if len(reqs) != 2*tt.perStep {
				t.Fatalf("%d requests to %s, want %d", len(reqs), tt.path, 2*tt.perStep)
			}
			seeds := map[float64]bool{}
			for _, rq := range reqs {
				var body map[string]any
				if err := json.Unmarshal(rq.Body, &body); err != nil {
					t.Fatal(err)
				}
				params, seedKey, maxKey := body, "seed", "max_tokens"
				if tt.engine == EngineSGLang {
					params, seedKey, maxKey = body["sampling_params"].(map[string]any), "sampling_seed", "max_new_tokens"
				}
				if params[maxKey] != 16.0 || params["temperature"] != 1.0 || params["ignore_eos"] != false {
					t.Fatalf("request %s: want %s 16, temperature 1, ignore_eos false", rq.Body, maxKey)
				}
				seed, ok := params[seedKey].(float64)
				if !ok || seed <= 0 {
					t.Fatalf("request %s: no positive %s", rq.Body, seedKey)
				}
				seeds[seed] = true
			}
			if len(seeds) != 2*tt.perStep {
				t.Errorf("%d distinct seeds over %d requests of 2 steps, want one each", len(seeds), len(reqs))
			}
		})
	}
	t.Run("2 ranks", func(t *testing.T) {
		srv := enginetest.NewSGLang(fakePolicy)
		defer srv.Close()
		one := runLive(t, liveOn(t, EngineSGLang, srv.URL, 1), 1)
		two := runLive(t, liveOn(t, EngineSGLang, srv.URL, 1), 2)
		if !reflect.DeepEqual(one.rollouts[1], two.rollouts[1]) {
			t.Error("2 ranks trained on other rollouts than 1")
		}
		if got := srv.Count("/generate"); got != 128 {
			t.Errorf("%d requests for 2 runs of 64 samples: rank 1 asked the engine too", got)
		}
	})
}

// readPrompts reads the live recipe's prompt file.
func readPrompts(t *testing.T) ([][]int32, error) {
	t.Helper()
	var out [][]int32
	for _, line := range strings.Split(strings.TrimSpace(readFile(t, filepath.Join("..", "examples", "data", "tiny-prompts.jsonl"))), "\n") {
		var p struct {
			PromptTokens []int32 `json:"prompt_tokens"`
		}
		if err := json.Unmarshal([]byte(line), &p); err != nil {
			return nil, err
		}
		out = append(out, p.PromptTokens)
	}
	return out, nil
}

func near(a, b, tol float64) bool { return a-b <= tol && b-a <= tol }

// TestGenerateEngineErrors: an engine that fails fails the step, with the
// stage, the request and the engine's own message; nothing is trained on a
// partial or foreign batch.
func TestGenerateEngineErrors(t *testing.T) {
	tests := []struct {
		name  string
		setup func(*enginetest.Server)
		s     enginetest.Sampler
		want  []string
	}{
		{"bad request", func(s *enginetest.Server) {
			s.RespondNext("/generate", 400, `{"error":{"message":"prompt is too long"}}`, 1)
		}, nil, []string{`stage "generate"`, "HTTP 400", "prompt is too long"}},
		{"dead engine", func(s *enginetest.Server) { s.Close() }, nil, []string{`stage "generate"`, "connection refused"}},
		{"aborted", func(s *enginetest.Server) { s.AbortNext(1) }, nil, []string{`stage "generate"`, "abort"}},
		{"foreign vocabulary", nil, func(p []int32, n int, pa engines.Params) []engines.Response {
			out := fakePolicy(p, n, pa)
			out[n-1].Tokens[0] = 300
			return out
		}, []string{`stage "generate"`, "returned id 300, outside the vocabulary of 256"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.s
			if s == nil {
				s = fakePolicy
			}
			srv := enginetest.NewSGLang(s)
			defer srv.Close()
			if tt.setup != nil {
				tt.setup(srv)
			}
			err := runErr(t, liveOn(t, EngineSGLang, srv.URL, 1))
			if err == nil {
				t.Fatal("the run succeeded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestPushWeights pushes the actor to an SGLang test engine after every
// step, on 1 and 2 ranks: the engine reloads from each step's version
// directory, the link names the latest, older versions are gone, and the
// pushed checkpoint holds the export's tensors, value for value.
func TestPushWeights(t *testing.T) {
	for _, dp := range []int{1, 2} {
		t.Run(strconv.Itoa(dp)+" ranks", func(t *testing.T) {
			dir := t.TempDir()
			srv := enginetest.NewSGLang(fakePolicy)
			defer srv.Close()
			link := filepath.Join(dir, "policy")
			s := liveOn(t, EngineSGLang, srv.URL, 2, "    - {id: sync_ref, uses: update_ref, when: step % 6 == 0}\n",
				"    - {id: sync_ref, uses: update_ref, when: step % 6 == 0}\n    - {id: push, uses: push_weights, with: {dir: "+link+", dtype: fp32, engine: sglang, url: '"+srv.URL+"'}}\n")
			s.Mesh.GPUsPerNode, s.Mesh.DP = dp, dp
			j := resolveSpec(t, s)
			p, err := Plan(j)
			if err != nil {
				t.Fatal(err)
			}
			var stats []map[string]float64
			res, err := Run(context.Background(), j, p, RunOptions{Export: "actor", AfterStep: func(r *Rank, sr StepResult) error {
				if r.ID == 0 {
					if got, want := srv.ModelPath(), link+".step-"+strconv.Itoa(sr.Step); got != want {
						t.Errorf("after step %d the engine loaded %q, want %q", sr.Step, got, want)
					}
					stats = append(stats, sr.Stats.Values)
				}
				return nil
			}})
			if err != nil {
				t.Fatal(err)
			}
			if got := srv.Count("/update_weights_from_disk"); got != 2 {
				t.Errorf("%d reloads in 2 steps, want 2", got)
			}
			if target, err := os.Readlink(link); err != nil || target != "policy.step-2" {
				t.Errorf("link %s -> %q (%v), want policy.step-2", link, target, err)
			}
			entries, _ := os.ReadDir(dir)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			if !reflect.DeepEqual(names, []string{"policy", "policy.step-2"}) {
				t.Errorf("%s holds %v, want the link and the latest version only", dir, names)
			}
			for i, st := range stats {
				if st["push_gb"] <= 0 || st["push_write_s"] <= 0 {
					t.Errorf("step %d: push_gb %v, push_write_s %v", i+1, st["push_gb"], st["push_write_s"])
				}
			}
			want := filepath.Join(dir, "export")
			if _, err := ExportHF(j.Models["actor"], dp, res.Export, want, ExportOptions{DType: "fp32"}); err != nil {
				t.Fatal(err)
			}
			if readFile(t, filepath.Join(link, "config.json")) != readFile(t, filepath.Join(want, "config.json")) {
				t.Error("the pushed config.json differs from the export's")
			}
			sameTensors(t, link, want)
		})
	}
	t.Run("reload refused", func(t *testing.T) {
		srv := enginetest.NewSGLang(fakePolicy)
		defer srv.Close()
		srv.RespondNext("/update_weights_from_disk", 200, `{"success": false, "message": "shape mismatch in lm_head"}`, 1)
		link := filepath.Join(t.TempDir(), "policy")
		err := runErr(t, liveOn(t, EngineSGLang, srv.URL, 1, "    - {id: sync_ref, uses: update_ref, when: step % 6 == 0}\n",
			"    - {id: push, uses: push_weights, with: {dir: "+link+", engine: sglang, url: '"+srv.URL+"'}}\n"))
		if err == nil || !strings.Contains(err.Error(), "shape mismatch in lm_head") || !strings.Contains(err.Error(), `stage "push"`) {
			t.Errorf("error %v, want the engine's refusal in stage push", err)
		}
	})
}

// sameTensors checks that the checkpoints in directories a and b hold the
// same tensors: names, dtypes, shapes and values (the files may order them
// differently).
func sameTensors(t *testing.T, a, b string) {
	t.Helper()
	ca, err := model.OpenCheckpoint(a)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	cb, err := model.OpenCheckpoint(b)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	if !reflect.DeepEqual(ca.Names(), cb.Names()) {
		t.Fatalf("tensors %v, want %v", ca.Names(), cb.Names())
	}
	for _, n := range ca.Names() {
		ia, _, _ := ca.Tensor(n)
		ib, _, _ := cb.Tensor(n)
		if ia.DType != ib.DType || !reflect.DeepEqual(ia.Shape, ib.Shape) {
			t.Errorf("%s: %s %v, want %s %v", n, ia.DType, ia.Shape, ib.DType, ib.Shape)
			continue
		}
		da, db := make([]float32, ia.NumElements()), make([]float32, ib.NumElements())
		if err := ca.ReadRows(n, 0, ia.Shape[0], da); err != nil {
			t.Fatal(err)
		}
		if err := cb.ReadRows(n, 0, ib.Shape[0], db); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(da, db) {
			t.Errorf("%s: the values differ", n)
		}
	}
}
