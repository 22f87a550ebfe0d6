package engines

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// sglang is the client of SGLang's native HTTP API.
type sglang struct {
	r *requester
}

var _ Client = (*sglang)(nil)

// NewSGLang returns the client of the SGLang server at baseURL (such as
// http://127.0.0.1:30000).
//
// Generate sends one POST /generate per prompt and sample, as slime does,
// so that the concurrency bound and the retries work per sample, and reads
// the tokens and log-probs from meta_info.output_token_logprobs.
// ReloadFromDisk is POST /update_weights_from_disk, ReleaseMemory and
// ResumeMemory POST /release_memory_occupation and
// /resume_memory_occupation (every tag), Health GET /health_generate (GET
// /health where that is 404).
func NewSGLang(baseURL string, o Options) (Client, error) {
	r, err := newRequester(KindSGLang, baseURL, o)
	if err != nil {
		return nil, err
	}
	return &sglang{r: r}, nil
}

// sglangGenerate is the body of POST /generate.
type sglangGenerate struct {
	InputIDs       []int32        `json:"input_ids"`
	SamplingParams sglangSampling `json:"sampling_params"`
	ReturnLogprob  bool           `json:"return_logprob"`
}

// sglangSampling is its sampling_params.
type sglangSampling struct {
	MaxNewTokens      int     `json:"max_new_tokens"`
	Temperature       float64 `json:"temperature"`
	TopP              float64 `json:"top_p"`
	TopK              int     `json:"top_k"` // -1: off
	StopTokenIDs      []int   `json:"stop_token_ids,omitempty"`
	IgnoreEOS         bool    `json:"ignore_eos"`
	NoStopTrim        bool    `json:"no_stop_trim"`
	SkipSpecialTokens bool    `json:"skip_special_tokens"`
	SamplingSeed      *int64  `json:"sampling_seed,omitempty"`
}

// sglangAnswer is the part of /generate's answer the client reads.
type sglangAnswer struct {
	MetaInfo *struct {
		FinishReason *struct {
			Type    string          `json:"type"`
			Matched json.RawMessage `json:"matched"`
			Message string          `json:"message"`
		} `json:"finish_reason"`
		// OutputTokenLogprobs holds [logprob, token id, text or null] per
		// generated token.
		OutputTokenLogprobs [][]json.RawMessage `json:"output_token_logprobs"`
	} `json:"meta_info"`
}

// Generate implements Client.
func (c *sglang) Generate(ctx context.Context, prompts [][]int32, n int, p Params) ([][]Response, error) {
	if err := checkGenerate(KindSGLang, prompts, n, p); err != nil {
		return nil, err
	}
	topK := p.TopK
	if topK == 0 {
		topK = -1
	}
	base := sglangSampling{
		MaxNewTokens:      p.MaxNewTokens,
		Temperature:       p.Temperature,
		TopP:              p.topP(),
		TopK:              topK,
		StopTokenIDs:      p.StopTokenIDs,
		IgnoreEOS:         p.IgnoreEOS,
		NoStopTrim:        true,
		SkipSpecialTokens: false,
	}
	out := newResults(len(prompts), n)
	err := fanOut(ctx, len(prompts)*n, c.r.conc, func(ctx context.Context, k int) error {
		i, j := k/n, k%n
		sp := base
		sp.SamplingSeed = p.seed(k)
		q := &request{op: "generate", method: http.MethodPost, path: "/generate", prompt: i, sample: j, generation: true,
			body: &sglangGenerate{InputIDs: prompts[i], SamplingParams: sp, ReturnLogprob: true}}
		rep, err := c.r.do(ctx, q)
		if err != nil {
			return err
		}
		out[i][j], err = c.decode(q, rep)
		return err
	})
	if err != nil {
		if e := (*Error)(nil); !errors.As(err, &e) {
			err = fmt.Errorf("%s generate: POST %s/generate: %w", KindSGLang, c.r.base, err)
		}
		return nil, err
	}
	return out, nil
}

// decode reads one /generate answer.
func (c *sglang) decode(q *request, rep *reply) (Response, error) {
	body := bytes.TrimSpace(rep.body)
	var a sglangAnswer
	var err error
	if len(body) > 0 && body[0] == '[' {
		// A batch of one, as servers answer a list of prompts.
		var batch []sglangAnswer
		if err = json.Unmarshal(body, &batch); err == nil && len(batch) != 1 {
			err = fmt.Errorf("the answer is a list of %d results, want one", len(batch))
		}
		if err == nil {
			a = batch[0]
		}
	} else {
		err = json.Unmarshal(body, &a)
	}
	if err != nil {
		return Response{}, c.r.fail(q, rep, "", fmt.Errorf("decoding the answer: %w", err))
	}
	mi := a.MetaInfo
	switch {
	case mi == nil:
		return Response{}, c.r.fail(q, rep, "", errors.New("the answer has no meta_info"))
	case mi.FinishReason == nil:
		return Response{}, c.r.fail(q, rep, "", errors.New("the answer has no meta_info.finish_reason"))
	}
	var r Response
	switch t := mi.FinishReason.Type; t {
	case FinishStop, FinishLength:
		r.Finish = t
	case "abort":
		return Response{}, c.r.fail(q, rep, mi.FinishReason.Message, errors.New("the engine aborted the request"))
	default:
		return Response{}, c.r.fail(q, rep, "", fmt.Errorf("unknown finish_reason type %q", t))
	}
	if mi.OutputTokenLogprobs == nil {
		return Response{}, c.r.fail(q, rep, "", errors.New("the answer has no meta_info.output_token_logprobs"))
	}
	r.Tokens = make([]int32, len(mi.OutputTokenLogprobs))
	r.LogProbs = make([]float32, len(mi.OutputTokenLogprobs))
	for t, entry := range mi.OutputTokenLogprobs {
		if r.Tokens[t], r.LogProbs[t], err = logprobEntry(entry); err != nil {
			return Response{}, c.r.fail(q, rep, "", fmt.Errorf("meta_info.output_token_logprobs[%d]: %w", t, err))
		}
	}
	return r, nil
}

// logprobEntry reads an output_token_logprobs entry: [logprob, token id,
// text or null].
func logprobEntry(entry []json.RawMessage) (int32, float32, error) {
	if len(entry) < 2 {
		return 0, 0, fmt.Errorf("want [logprob, token id, text], got %d values", len(entry))
	}
	lp, id := bytes.TrimSpace(entry[0]), bytes.TrimSpace(entry[1])
	if string(lp) == "null" {
		return 0, 0, errors.New("the log-prob is null")
	}
	f, err := strconv.ParseFloat(string(lp), 64)
	if err != nil {
		return 0, 0, fmt.Errorf("the log-prob %s is not a number", lp)
	}
	v, err := strconv.ParseInt(string(id), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("the token id %s is not an integer", id)
	}
	tok, err := tokenID(v)
	return tok, float32(f), err
}

// sglangUpdate is the answer of /update_weights_from_disk.
type sglangUpdate struct {
	Success *bool  `json:"success"`
	Message string `json:"message"`
	// NumPausedRequests is an int, or a list with dp_size > 1.
	NumPausedRequests json.RawMessage `json:"num_paused_requests"`
}

// ReloadFromDisk implements Client: POST /update_weights_from_disk with
// {"model_path": dir}. An answer with "success": false is an error carrying
// the engine's message; an empty or non-JSON 2xx answer is success.
func (c *sglang) ReloadFromDisk(ctx context.Context, dir string) error {
	q := &request{op: "reload_from_disk", method: http.MethodPost, path: "/update_weights_from_disk", prompt: -1, sample: -1,
		body: map[string]string{"model_path": dir}}
	rep, err := c.r.do(ctx, q)
	if err != nil {
		return err
	}
	var u sglangUpdate
	if json.Unmarshal(rep.body, &u) == nil && u.Success != nil && !*u.Success {
		return c.r.fail(q, rep, u.Message, errors.New("the engine did not load the weights"))
	}
	return nil
}

// ReleaseMemory implements Client: POST /release_memory_occupation with {}
// (every tag: weights and KV cache).
func (c *sglang) ReleaseMemory(ctx context.Context) error {
	return c.control(ctx, "release_memory", "/release_memory_occupation")
}

// ResumeMemory implements Client: POST /resume_memory_occupation with {}.
func (c *sglang) ResumeMemory(ctx context.Context) error {
	return c.control(ctx, "resume_memory", "/resume_memory_occupation")
}

// control POSTs {} to path; any 2xx answer is success.
func (c *sglang) control(ctx context.Context, op, path string) error {
	_, err := c.r.do(ctx, &request{op: op, method: http.MethodPost, path: path, prompt: -1, sample: -1, body: struct{}{}})
	return err
}

// Health implements Client: GET /health_generate, which runs a one-token
// generation, or GET /health where the server has no /health_generate.
// It makes one attempt.
func (c *sglang) Health(ctx context.Context) error {
	_, err := c.r.do(ctx, &request{op: "health", method: http.MethodGet, path: "/health_generate", prompt: -1, sample: -1, once: true})
	var e *Error
	if errors.As(err, &e) && e.StatusCode == http.StatusNotFound {
		_, err = c.r.do(ctx, &request{op: "health", method: http.MethodGet, path: "/health", prompt: -1, sample: -1, once: true})
	}
	return err
}
