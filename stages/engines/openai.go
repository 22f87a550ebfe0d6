package engines

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// openAI is the client of an OpenAI-compatible server (vLLM).
type openAI struct {
	r     *requester
	model string
}

var _ Client = (*openAI)(nil)

// NewOpenAI returns the client of the OpenAI-compatible server at baseURL
// (such as http://127.0.0.1:8000; a trailing /v1 is dropped, since the
// client adds it to the completions path only).
//
// Generate sends one POST /v1/completions per prompt with "n" samples and
// reads the token ids from choices[].token_ids (vLLM ≥ 0.10.2) or else
// from logprobs.tokens as "token_id:N", and the log-probs from
// logprobs.token_logprobs. The control calls use vLLM's development
// endpoints, served only with VLLM_SERVER_DEV_MODE=1: ReloadFromDisk is
// POST /collective_rpc (reload_weights) then POST /reset_prefix_cache,
// ReleaseMemory POST /sleep?level=1 (which also needs --enable-sleep-mode),
// ResumeMemory POST /wake_up. Health is GET /health.
func NewOpenAI(baseURL string, o Options) (Client, error) {
	if u, err := url.Parse(baseURL); err == nil {
		u.Path = strings.TrimSuffix(strings.TrimRight(u.Path, "/"), "/v1")
		u.RawPath = ""
		baseURL = u.String()
	}
	r, err := newRequester(KindOpenAI, baseURL, o)
	if err != nil {
		return nil, err
	}
	return &openAI{r: r, model: o.Model}, nil
}

// openAICompletion is the body of POST /v1/completions.
type openAICompletion struct {
	Model                  string  `json:"model,omitempty"`
	Prompt                 []int32 `json:"prompt"`
	N                      int     `json:"n"`
	MaxTokens              int     `json:"max_tokens"`
	Temperature            float64 `json:"temperature"`
	TopP                   float64 `json:"top_p"`
	TopK                   int     `json:"top_k,omitempty"` // only when > 0
	StopTokenIDs           []int   `json:"stop_token_ids,omitempty"`
	IgnoreEOS              bool    `json:"ignore_eos"`
	Logprobs               int     `json:"logprobs"`
	ReturnTokensAsTokenIDs bool    `json:"return_tokens_as_token_ids"`
	ReturnTokenIDs         bool    `json:"return_token_ids"`
	SkipSpecialTokens      bool    `json:"skip_special_tokens"`
	Seed                   *int64  `json:"seed,omitempty"`
}

// openAIAnswer is the part of /v1/completions' answer the client reads.
type openAIAnswer struct {
	Choices []struct {
		Index    *int `json:"index"`
		Logprobs *struct {
			Tokens        []string      `json:"tokens"`
			TokenLogprobs []optionalNum `json:"token_logprobs"`
		} `json:"logprobs"`
		FinishReason *string         `json:"finish_reason"`
		StopReason   json.RawMessage `json:"stop_reason"`
		TokenIDs     []int64         `json:"token_ids"`
	} `json:"choices"`
}

// optionalNum is a JSON number or null.
type optionalNum struct {
	v     float64
	valid bool
}

// UnmarshalJSON implements json.Unmarshaler.
func (o *optionalNum) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*o = optionalNum{}
		return nil
	}
	v, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return fmt.Errorf("log-prob %s is not a number", b)
	}
	*o = optionalNum{v: v, valid: true}
	return nil
}

// Generate implements Client.
func (c *openAI) Generate(ctx context.Context, prompts [][]int32, n int, p Params) ([][]Response, error) {
	if err := checkGenerate(KindOpenAI, prompts, n, p); err != nil {
		return nil, err
	}
	out := newResults(len(prompts), n)
	err := fanOut(ctx, len(prompts), c.r.conc, func(ctx context.Context, i int) error {
		q := &request{op: "generate", method: http.MethodPost, path: "/v1/completions", prompt: i, sample: -1, generation: true,
			body: &openAICompletion{
				Model:                  c.model,
				Prompt:                 prompts[i],
				N:                      n,
				MaxTokens:              p.MaxNewTokens,
				Temperature:            p.Temperature,
				TopP:                   p.topP(),
				TopK:                   p.TopK,
				StopTokenIDs:           p.StopTokenIDs,
				IgnoreEOS:              p.IgnoreEOS,
				Logprobs:               0,
				ReturnTokensAsTokenIDs: true,
				ReturnTokenIDs:         true,
				SkipSpecialTokens:      false,
				Seed:                   p.seed(i),
			}}
		rep, err := c.r.do(ctx, q)
		if err != nil {
			return err
		}
		return c.decode(q, rep, out[i])
	})
	if err != nil {
		if e := (*Error)(nil); !errors.As(err, &e) {
			err = fmt.Errorf("%s generate: POST %s/v1/completions: %w", KindOpenAI, c.r.base, err)
		}
		return nil, err
	}
	return out, nil
}

// decode reads one /v1/completions answer into the n responses of its
// prompt, placing each choice by its index.
func (c *openAI) decode(q *request, rep *reply, into []Response) error {
	var a openAIAnswer
	if err := json.Unmarshal(rep.body, &a); err != nil {
		return c.r.fail(q, rep, "", fmt.Errorf("decoding the answer: %w", err))
	}
	if len(a.Choices) != len(into) {
		return c.r.fail(q, rep, "", fmt.Errorf("the answer has %d choices, want n = %d", len(a.Choices), len(into)))
	}
	seen := make([]bool, len(into))
	for k, ch := range a.Choices {
		failed := func(format string, args ...any) error {
			return c.r.fail(q, rep, "", fmt.Errorf("choices[%d]: %s", k, fmt.Sprintf(format, args...)))
		}
		if ch.Index == nil || *ch.Index < 0 || *ch.Index >= len(into) || seen[*ch.Index] {
			idx := "none"
			if ch.Index != nil {
				idx = strconv.Itoa(*ch.Index)
			}
			return failed("index %s is missing, out of [0, %d) or repeated", idx, len(into))
		}
		seen[*ch.Index] = true
		var r Response
		switch {
		case ch.FinishReason == nil:
			return failed("no finish_reason")
		case *ch.FinishReason == FinishStop || *ch.FinishReason == FinishLength:
			r.Finish = *ch.FinishReason
		default:
			return failed("finish_reason %q (want stop or length)", *ch.FinishReason)
		}
		if ch.Logprobs == nil {
			return failed("no logprobs")
		}
		lps := ch.Logprobs.TokenLogprobs
		var err error
		if ch.TokenIDs != nil {
			r.Tokens = make([]int32, len(ch.TokenIDs))
			for t, v := range ch.TokenIDs {
				if r.Tokens[t], err = tokenID(v); err != nil {
					return failed("token_ids[%d]: %v", t, err)
				}
			}
		} else if r.Tokens, err = parseTokenIDs(ch.Logprobs.Tokens); err != nil {
			return failed("no token_ids, and logprobs.tokens %v (return_tokens_as_token_ids needs a recent vLLM)", err)
		}
		if len(lps) != len(r.Tokens) {
			return failed("%d tokens but %d logprobs.token_logprobs", len(r.Tokens), len(lps))
		}
		r.LogProbs = make([]float32, len(lps))
		for t, lp := range lps {
			if !lp.valid {
				return failed("logprobs.token_logprobs[%d] is null", t)
			}
			r.LogProbs[t] = float32(lp.v)
		}
		into[*ch.Index] = r
	}
	return nil
}

// parseTokenIDs reads logprobs.tokens written as "token_id:N".
func parseTokenIDs(tokens []string) ([]int32, error) {
	ids := make([]int32, len(tokens))
	for t, s := range tokens {
		num, ok := strings.CutPrefix(s, "token_id:")
		v, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("[%d] is %q, not \"token_id:N\"", t, bounded(s))
		}
		if ids[t], err = tokenID(v); err != nil {
			return nil, fmt.Errorf("[%d]: %w", t, err)
		}
	}
	return ids, nil
}

// devModeHint explains a 404 of a vLLM development endpoint.
func devModeHint(what string) func(int) string {
	return func(status int) string {
		if status != http.StatusNotFound {
			return ""
		}
		return "vLLM serves " + what
	}
}

// ReloadFromDisk implements Client: POST /collective_rpc with
// {"method": "reload_weights", "kwargs": {"weights_path": dir,
// "is_checkpoint_format": true}}, then POST /reset_prefix_cache so that no
// cached KV of the old weights is reused. Both need a server started with
// VLLM_SERVER_DEV_MODE=1, and a vLLM whose reload_weights takes
// weights_path; a 404 says so. Any 2xx answer is success.
func (c *openAI) ReloadFromDisk(ctx context.Context, dir string) error {
	body := map[string]any{
		"method": "reload_weights",
		"kwargs": map[string]any{"weights_path": dir, "is_checkpoint_format": true},
	}
	_, err := c.r.do(ctx, &request{op: "reload_from_disk", method: http.MethodPost, path: "/collective_rpc", prompt: -1, sample: -1, body: body,
		hint: devModeHint("/collective_rpc only when started with VLLM_SERVER_DEV_MODE=1, and reload_weights takes weights_path only in a recent vLLM")})
	if err != nil {
		return err
	}
	_, err = c.r.do(ctx, &request{op: "reload_from_disk", method: http.MethodPost, path: "/reset_prefix_cache", prompt: -1, sample: -1,
		hint: devModeHint("/reset_prefix_cache only when started with VLLM_SERVER_DEV_MODE=1")})
	return err
}

// ReleaseMemory implements Client: POST /sleep?level=1, which offloads the
// weights to host memory and drops the KV cache. It needs a server started
// with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1; a 404 says so.
func (c *openAI) ReleaseMemory(ctx context.Context) error {
	_, err := c.r.do(ctx, &request{op: "release_memory", method: http.MethodPost, path: "/sleep?level=1", prompt: -1, sample: -1,
		hint: devModeHint("/sleep only when started with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1")})
	return err
}

// ResumeMemory implements Client: POST /wake_up (every tag).
func (c *openAI) ResumeMemory(ctx context.Context) error {
	_, err := c.r.do(ctx, &request{op: "resume_memory", method: http.MethodPost, path: "/wake_up", prompt: -1, sample: -1,
		hint: devModeHint("/wake_up only when started with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1")})
	return err
}

// Health implements Client: GET /health, one attempt.
func (c *openAI) Health(ctx context.Context) error {
	_, err := c.r.do(ctx, &request{op: "health", method: http.MethodGet, path: "/health", prompt: -1, sample: -1, once: true})
	return err
}
