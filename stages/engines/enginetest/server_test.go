package enginetest

import (
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rlpipe/rlpipe/stages/engines"
)

// post sends body to the server's path and returns the status and body.
func post(t *testing.T, s *Server, path, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(s.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestFaultOrder(t *testing.T) {
	s := NewSGLang(nil)
	defer s.Close()
	s.FailNext("/release_memory_occupation", 500, 1)
	s.PassNext("/release_memory_occupation", 2)
	s.RespondNext("/release_memory_occupation", 418, `{"message":"teapot"}`, 1)
	var got []int
	for range 5 {
		status, _ := post(t, s, "/release_memory_occupation", `{}`)
		got = append(got, status)
	}
	if want := []int{500, 200, 200, 418, 200}; !reflect.DeepEqual(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
	if s.Releases() != 3 || s.Count("/release_memory_occupation") != 5 {
		t.Errorf("%d releases of %d requests", s.Releases(), s.Count("/release_memory_occupation"))
	}
}

func TestStrictRequests(t *testing.T) {
	tests := []struct {
		name  string
		start func(Sampler) *Server
		path  string
		body  string
		want  int
	}{
		{"sglang ok", NewSGLang, "/generate", `{"input_ids":[1],"sampling_params":{"max_new_tokens":2},"return_logprob":true}`, 200},
		{"sglang unknown field", NewSGLang, "/generate", `{"input_ids":[1],"rid":"x"}`, 400},
		{"sglang unknown sampling param", NewSGLang, "/generate", `{"input_ids":[1],"sampling_params":{"max_tokens":2}}`, 400},
		{"sglang top_k 0", NewSGLang, "/generate", `{"input_ids":[1],"sampling_params":{"top_k":0}}`, 400},
		{"sglang a list of prompts", NewSGLang, "/generate", `{"input_ids":[[1],[2]]}`, 400},
		{"sglang text", NewSGLang, "/generate", `{"text":"hi"}`, 400},
		{"sglang reload without model_path", NewSGLang, "/update_weights_from_disk", `{"flush_cache":true}`, 400},
		{"openai ok", NewOpenAI, "/v1/completions", `{"prompt":[1],"max_tokens":2,"logprobs":0}`, 200},
		{"openai text prompt", NewOpenAI, "/v1/completions", `{"prompt":"hi"}`, 400},
		{"openai unknown field", NewOpenAI, "/v1/completions", `{"prompt":[1],"max_new_tokens":2}`, 400},
		{"openai unknown rpc", NewOpenAI, "/collective_rpc", `{"method":"sleep"}`, 500},
		{"openai sleep level 3", NewOpenAI, "/sleep?level=3", ``, 400},
		{"unknown path", NewOpenAI, "/update_weights_from_disk", `{}`, 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.start(nil)
			defer s.Close()
			if status, body := post(t, s, tt.path, tt.body); status != tt.want {
				t.Errorf("status %d (%s), want %d", status, body, tt.want)
			}
		})
	}
}

func TestSGLangShape(t *testing.T) {
	s := NewSGLang(func(prompt []int32, n int, p engines.Params) []engines.Response {
		return []engines.Response{{Tokens: []int32{4, 5, 2}, LogProbs: []float32{-0.5, -1, -0.125}, Finish: "stop"}}
	})
	defer s.Close()
	_, body := post(t, s, "/generate", `{"input_ids":[1,2],"sampling_params":{"max_new_tokens":8,"stop_token_ids":[2]},"return_logprob":true}`)
	var got struct {
		OutputIDs []int `json:"output_ids"`
		MetaInfo  struct {
			FinishReason        map[string]any `json:"finish_reason"`
			OutputTokenLogprobs [][]any        `json:"output_token_logprobs"`
			CompletionTokens    int            `json:"completion_tokens"`
		} `json:"meta_info"`
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	want := [][]any{{-0.5, 4.0, nil}, {-1.0, 5.0, nil}, {-0.125, 2.0, nil}}
	if !reflect.DeepEqual(got.MetaInfo.OutputTokenLogprobs, want) {
		t.Errorf("output_token_logprobs %v, want %v", got.MetaInfo.OutputTokenLogprobs, want)
	}
	if fr := got.MetaInfo.FinishReason; fr["type"] != "stop" || fr["matched"] != 2.0 {
		t.Errorf("finish_reason %v", fr)
	}
	if !reflect.DeepEqual(got.OutputIDs, []int{4, 5}) || got.MetaInfo.CompletionTokens != 3 {
		t.Errorf("output_ids %v, completion_tokens %d", got.OutputIDs, got.MetaInfo.CompletionTokens)
	}
}

func TestOpenAIShape(t *testing.T) {
	tests := []struct {
		name       string
		body       string
		omit       bool
		wantTokens []any
		wantIDs    bool
		wantLen    int
	}{
		{name: "token ids", body: `{"prompt":[1],"n":2,"max_tokens":3,"logprobs":0,"return_tokens_as_token_ids":true,"return_token_ids":true}`,
			wantTokens: []any{"token_id:2", "token_id:3", "token_id:4"}, wantIDs: true, wantLen: 3},
		{name: "old vLLM", omit: true, body: `{"prompt":[1],"n":2,"max_tokens":3,"logprobs":0,"return_tokens_as_token_ids":true,"return_token_ids":true}`,
			wantTokens: []any{"token_id:2", "token_id:3", "token_id:4"}, wantLen: 3},
		{name: "text tokens, max_tokens defaults to 16", body: `{"prompt":[1],"n":2,"logprobs":0}`, wantLen: 16},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewOpenAI(nil)
			defer s.Close()
			s.OmitTokenIDs(tt.omit)
			_, body := post(t, s, "/v1/completions", tt.body)
			var got struct {
				Choices []map[string]any `json:"choices"`
			}
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				t.Fatal(err)
			}
			if len(got.Choices) != 2 || got.Choices[0]["index"] != 1.0 || got.Choices[1]["index"] != 0.0 {
				t.Fatalf("choices %v, want two in reverse order", got.Choices)
			}
			c := got.Choices[1]
			lp := c["logprobs"].(map[string]any)
			tokens := lp["tokens"].([]any)
			if len(tokens) != tt.wantLen || len(lp["token_logprobs"].([]any)) != tt.wantLen {
				t.Errorf("%d tokens, want %d", len(tokens), tt.wantLen)
			}
			if tt.wantTokens != nil && !reflect.DeepEqual(tokens, tt.wantTokens) {
				t.Errorf("tokens %v, want %v", tokens, tt.wantTokens)
			}
			if tt.wantTokens == nil && !strings.HasPrefix(tokens[0].(string), "<") {
				t.Errorf("tokens %v, want text", tokens)
			}
			if _, ok := c["token_ids"]; ok != tt.wantIDs {
				t.Errorf("token_ids present %v, want %v", ok, tt.wantIDs)
			}
			if c["finish_reason"] != "length" {
				t.Errorf("finish_reason %v", c["finish_reason"])
			}
		})
	}
}

func TestHangEndsOnClose(t *testing.T) {
	s := NewOpenAI(nil)
	s.Hang("/health")
	errc := make(chan error, 1)
	go func() {
		resp, err := http.Get(s.URL + "/health")
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	for s.InFlight("/health") == 0 {
		time.Sleep(time.Millisecond)
	}
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(3 * time.Second):
		t.Fatal("Close did not return with a request hanging")
	}
	<-errc
}
