package engines_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/rlpipe/rlpipe/stages/engines"
	"github.com/rlpipe/rlpipe/stages/engines/enginetest"
)

var openAIEngine = bothEngines[1]

// choice returns a /v1/completions choice; ids nil leaves token_ids out.
func choice(index int, finish string, tokens []string, lps []any, ids []int) map[string]any {
	c := map[string]any{"index": index, "text": "", "finish_reason": finish, "stop_reason": nil,
		"logprobs": map[string]any{"tokens": tokens, "token_logprobs": lps, "top_logprobs": nil, "text_offset": []int{}}}
	if ids != nil {
		c["token_ids"] = ids
	}
	return c
}

// completion returns a /v1/completions answer.
func completion(choices ...map[string]any) string {
	b, _ := json.Marshal(map[string]any{"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": choices,
		"usage": map[string]int{"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}})
	return string(b)
}

func TestOpenAIDecode(t *testing.T) {
	ok := []engines.Response{
		{Tokens: []int32{5, 6}, LogProbs: []float32{-0.5, -0.25}, Finish: "stop"},
		{Tokens: []int32{7}, LogProbs: []float32{-2}, Finish: "length"},
	}
	tests := []struct {
		name    string
		body    string
		want    []engines.Response
		wantErr []string
	}{
		{name: "token_ids, choices out of order",
			body: completion(choice(1, "length", []string{"token_id:7"}, []any{-2}, []int{7}),
				choice(0, "stop", []string{"token_id:5", "token_id:6"}, []any{-0.5, -0.25}, []int{5, 6})),
			want: ok},
		{name: "no token_ids: token_id:N",
			body: completion(choice(0, "stop", []string{"token_id:5", "token_id:6"}, []any{-0.5, -0.25}, nil),
				choice(1, "length", []string{"token_id:7"}, []any{-2}, nil)),
			want: ok},
		{name: "token_ids win over text tokens",
			body: completion(choice(0, "stop", []string{"a", "b"}, []any{-0.5, -0.25}, []int{5, 6}),
				choice(1, "length", []string{"c"}, []any{-2}, []int{7})),
			want: ok},
		{name: "text tokens without token_ids",
			body:    completion(choice(0, "stop", []string{"a"}, []any{-0.5}, nil), choice(1, "stop", []string{"b"}, []any{-1}, nil)),
			wantErr: []string{"choices[0]", "no token_ids", `"a"`, "token_id:N"}},
		{name: "fewer log-probs than tokens",
			body:    completion(choice(0, "stop", []string{"token_id:5", "token_id:6"}, []any{-0.5}, []int{5, 6}), choice(1, "length", []string{"token_id:7"}, []any{-2}, []int{7})),
			wantErr: []string{"choices[0]", "2 tokens but 1 logprobs.token_logprobs"}},
		{name: "null log-prob",
			body:    completion(choice(0, "stop", []string{"token_id:5"}, []any{nil}, []int{5}), choice(1, "length", []string{"token_id:7"}, []any{-2}, []int{7})),
			wantErr: []string{"token_logprobs[0] is null"}},
		{name: "one choice for n = 2",
			body:    completion(choice(0, "stop", []string{"token_id:5"}, []any{-1}, []int{5})),
			wantErr: []string{"1 choices, want n = 2"}},
		{name: "repeated index",
			body:    completion(choice(0, "stop", []string{"token_id:5"}, []any{-1}, []int{5}), choice(0, "stop", []string{"token_id:5"}, []any{-1}, []int{5})),
			wantErr: []string{"choices[1]", "index 0", "repeated"}},
		{name: "index out of range",
			body:    completion(choice(0, "stop", []string{"token_id:5"}, []any{-1}, []int{5}), choice(2, "stop", []string{"token_id:5"}, []any{-1}, []int{5})),
			wantErr: []string{"index 2"}},
		{name: "abort",
			body:    completion(choice(0, "abort", []string{}, []any{}, []int{}), choice(1, "stop", []string{"token_id:5"}, []any{-1}, []int{5})),
			wantErr: []string{`finish_reason "abort"`, "openai generate prompt 0", "/v1/completions", "HTTP 200"}},
		{name: "no logprobs", body: `{"choices":[{"index":0,"finish_reason":"stop","logprobs":null,"token_ids":[1]},{"index":1,"finish_reason":"stop","logprobs":null,"token_ids":[1]}]}`,
			wantErr: []string{"no logprobs"}},
		{name: "negative token id",
			body:    completion(choice(0, "stop", []string{"token_id:5"}, []any{-1}, []int{-5}), choice(1, "stop", []string{"token_id:5"}, []any{-1}, []int{5})),
			wantErr: []string{"token_ids[0]", "out of range"}},
		{name: "log-prob not a number", body: `{"choices":[{"index":0,"finish_reason":"stop","logprobs":{"tokens":["token_id:1"],"token_logprobs":["x"]}}]}`,
			wantErr: []string{"decoding the answer"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := serve(t, openAIEngine)
			srv.RespondNext("/v1/completions", 200, tt.body, 1)
			c := dial(t, openAIEngine, srv.URL, engines.Options{})
			out, err := c.Generate(context.Background(), [][]int32{{1, 2}}, 2, engines.Params{MaxNewTokens: 4})
			if tt.wantErr != nil {
				wantError(t, err, tt.wantErr...)
				if n := srv.Count("/v1/completions"); n != 1 {
					t.Errorf("%d requests, want 1 (a malformed answer is not retried)", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(out, [][]engines.Response{tt.want}) {
				t.Errorf("got %+v, want %+v", out, tt.want)
			}
		})
	}
}

func TestOpenAIRequests(t *testing.T) {
	prompts := [][]int32{{10, 11, 12}, {20}, {30, 31}}
	tests := []struct {
		name   string
		base   string // appended to the server's URL
		model  string
		n      int
		p      engines.Params
		oldVLM bool
		// want returns the body of the request of prompt i, without prompt.
		want func(i int) string
	}{
		{name: "defaults off", n: 2, p: engines.Params{MaxNewTokens: 5, Temperature: 1, TopP: 1},
			want: func(int) string {
				return `"n":2,"max_tokens":5,"temperature":1,"top_p":1,"ignore_eos":false,"logprobs":0,"return_tokens_as_token_ids":true,"return_token_ids":true,"skip_special_tokens":false`
			}},
		{name: "everything on, base URL with /v1/", base: "/v1/", model: "qwen", n: 4,
			p: engines.Params{MaxNewTokens: 7, Temperature: 0.7, TopP: 0.95, TopK: 50, StopTokenIDs: []int{151643}, IgnoreEOS: true, Seed: 42},
			want: func(i int) string {
				return fmt.Sprintf(`"model":"qwen","n":4,"max_tokens":7,"temperature":0.7,"top_p":0.95,"top_k":50,"stop_token_ids":[151643],"ignore_eos":true,"logprobs":0,"return_tokens_as_token_ids":true,"return_token_ids":true,"skip_special_tokens":false,"seed":%d`, 42+i)
			}},
		{name: "vLLM without token_ids", oldVLM: true, n: 3, p: engines.Params{MaxNewTokens: 3, Temperature: 0.5, StopTokenIDs: []int{23}},
			want: func(int) string {
				return `"n":3,"max_tokens":3,"temperature":0.5,"top_p":1,"stop_token_ids":[23],"ignore_eos":false,"logprobs":0,"return_tokens_as_token_ids":true,"return_token_ids":true,"skip_special_tokens":false`
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := serve(t, openAIEngine)
			srv.OmitTokenIDs(tt.oldVLM)
			srv.SetModel("qwen")
			c := dial(t, openAIEngine, srv.URL+tt.base, engines.Options{Concurrency: 1, Model: tt.model})
			out, err := c.Generate(context.Background(), prompts, tt.n, tt.p)
			if err != nil {
				t.Fatal(err)
			}
			reqs := srv.Requests("/v1/completions")
			if len(reqs) != len(prompts) {
				t.Fatalf("%d requests, want one per prompt: %d", len(reqs), len(prompts))
			}
			for i, r := range reqs { // one worker: in order
				ids, _ := json.Marshal(prompts[i])
				want := fmt.Sprintf(`{"prompt":%s,%s}`, ids, tt.want(i))
				if got := canonical(t, r.Body); got != canonical(t, []byte(want)) {
					t.Errorf("request %d:\n got %s\nwant %s", i, got, want)
				}
				sp := tt.p
				if sp.Seed != 0 {
					sp.Seed += int64(i)
				}
				if sp.TopP == 0 {
					sp.TopP = 1
				}
				if want := enginetest.Counting(prompts[i], tt.n, sp); !reflect.DeepEqual(out[i], want) {
					t.Errorf("result %d = %+v, want %+v", i, out[i], want)
				}
			}
		})
	}
}

func TestOpenAIWrongModel(t *testing.T) {
	srv := serve(t, openAIEngine)
	srv.SetModel("served")
	c := dial(t, openAIEngine, srv.URL, engines.Options{Model: "other"})
	_, err := c.Generate(context.Background(), [][]int32{{1}}, 1, engines.Params{MaxNewTokens: 1})
	wantError(t, err, "openai generate prompt 0", "/v1/completions", "HTTP 404", "The model `other` does not exist.")
	if n := srv.Count("/v1/completions"); n != 1 {
		t.Errorf("%d requests, want 1: a 404 is not retried", n)
	}
}

func TestOpenAIControl(t *testing.T) {
	devOff := func(s *enginetest.Server) { s.SetDevMode(false) }
	tests := []controlCase{
		{name: "reload", call: reload("/ckpt/step-9"), check: func(t *testing.T, s *enginetest.Server) {
			if got := s.Paths(); !reflect.DeepEqual(got, []string{"/collective_rpc", "/reset_prefix_cache"}) {
				t.Errorf("paths %q, want the reload then the prefix cache reset", got)
			}
			if s.ModelPath() != "/ckpt/step-9" || s.Reloads() != 1 || s.PrefixCacheResets() != 1 {
				t.Errorf("model path %q after %d reloads, %d resets", s.ModelPath(), s.Reloads(), s.PrefixCacheResets())
			}
			wantBody(t, s, "/collective_rpc", `{"method":"reload_weights","kwargs":{"weights_path":"/ckpt/step-9","is_checkpoint_format":true}}`)
			if b := s.Requests("/reset_prefix_cache")[0].Body; len(b) != 0 {
				t.Errorf("reset_prefix_cache body %q, want none", b)
			}
		}},
		{name: "reload empty answer", setup: respond("/collective_rpc", 200, ``), call: reload("/x"), check: count("/reset_prefix_cache", 1)},
		{name: "reload without dev mode", setup: devOff, call: reload("/x"),
			wantErr: []string{"openai reload_from_disk", "POST", "/collective_rpc", "HTTP 404", "VLLM_SERVER_DEV_MODE=1", "reload_weights takes weights_path", `{"detail":"Not Found"}`},
			check: func(t *testing.T, s *enginetest.Server) {
				if got := s.Paths(); !reflect.DeepEqual(got, []string{"/collective_rpc"}) {
					t.Errorf("paths %q: want one attempt and no reset", got)
				}
			}},
		{name: "reset 404", setup: respond("/reset_prefix_cache", 404, `{"detail":"Not Found"}`), call: reload("/x"),
			wantErr: []string{"/reset_prefix_cache", "HTTP 404", "VLLM_SERVER_DEV_MODE=1"}},
		{name: "reload 500 is retried", setup: fail("/collective_rpc", 500, 1), call: reload("/z"),
			check: func(t *testing.T, s *enginetest.Server) {
				if s.Count("/collective_rpc") != 2 || s.ModelPath() != "/z" {
					t.Errorf("%d requests, model path %q", s.Count("/collective_rpc"), s.ModelPath())
				}
			}},
		{name: "reload 400 names the message", setup: respond("/collective_rpc", 400, `{"object":"error","message":"bad kwargs","type":"BadRequestError","code":400}`),
			call: reload("/x"), wantErr: []string{"HTTP 400", `"bad kwargs"`}, check: count("/collective_rpc", 1)},
		{name: "release", call: engines.Client.ReleaseMemory, check: func(t *testing.T, s *enginetest.Server) {
			reqs := s.Requests("/sleep")
			if len(reqs) != 1 || reqs[0].Query != "level=1" || reqs[0].Method != "POST" || len(reqs[0].Body) != 0 {
				t.Fatalf("sleep requests %+v, want one POST /sleep?level=1", reqs)
			}
			if !s.Released() {
				t.Error("not released")
			}
		}},
		{name: "release then resume", call: func(c engines.Client, ctx context.Context) error {
			if err := c.ReleaseMemory(ctx); err != nil {
				return err
			}
			return c.ResumeMemory(ctx)
		}, check: func(t *testing.T, s *enginetest.Server) {
			if s.Released() || s.Releases() != 1 || s.Resumes() != 1 {
				t.Errorf("released %v after %d releases, %d resumes", s.Released(), s.Releases(), s.Resumes())
			}
		}},
		{name: "release without dev mode", setup: devOff, call: engines.Client.ReleaseMemory,
			wantErr: []string{"openai release_memory", "/sleep?level=1", "HTTP 404", "--enable-sleep-mode", "VLLM_SERVER_DEV_MODE=1"}},
		{name: "resume without dev mode", setup: devOff, call: engines.Client.ResumeMemory,
			wantErr: []string{"openai resume_memory", "/wake_up", "HTTP 404", "--enable-sleep-mode"}},
		{name: "health", call: engines.Client.Health, check: count("/health", 1)},
		{name: "health 500 is not retried", setup: fail("/health", 500, 1), call: engines.Client.Health,
			wantErr: []string{"openai health", "GET", "/health", "HTTP 500", `"injected failure"`}, check: count("/health", 1)},
	}
	runControl(t, openAIEngine, tests)
}
