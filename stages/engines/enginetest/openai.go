package enginetest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/rlpipe/rlpipe/stages/engines"
)

// NewOpenAI starts a server that speaks vLLM's OpenAI-compatible API:
//
//   - POST /v1/completions with a prompt of token ids (unknown fields are
//     refused with 400; max_tokens defaults to 16 and n to 1, as in vLLM)
//     answers {"id", "object": "text_completion", "created", "model",
//     "choices": [...], "usage"}. Each choice has "index", "text",
//     "logprobs": {"tokens": ["token_id:N", ...] (plain "<N>" without
//     return_tokens_as_token_ids), "token_logprobs", "top_logprobs",
//     "text_offset"} (null without logprobs), "finish_reason",
//     "stop_reason" (the matched stop token id or null), and "token_ids"
//     and "prompt_token_ids" with return_token_ids unless OmitTokenIDs.
//     The choices come in reverse index order, so that a client has to
//     place them by index.
//   - POST /collective_rpc with {"method": "reload_weights", "kwargs":
//     {"weights_path": dir, ...}} answers {"results": [null]}; POST
//     /reset_prefix_cache, POST /sleep?level=1 or 2 and POST /wake_up
//     answer 200 with an empty body. All four are 404 after
//     SetDevMode(false), as without VLLM_SERVER_DEV_MODE=1.
//   - GET /health answers 200 with an empty body.
//
// A nil sampler is Counting.
func NewOpenAI(s Sampler) *Server {
	return newServer(s, func(srv *Server) {
		srv.routes = map[string]route{
			"/v1/completions": {http.MethodPost, srv.openAICompletions},
			"/collective_rpc": {http.MethodPost, srv.devOnly(srv.openAIRPC)},
			"/reset_prefix_cache": {http.MethodPost, srv.devOnly(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				srv.record(func() { srv.prefixes++ })
				w.WriteHeader(http.StatusOK)
			})},
			"/sleep":   {http.MethodPost, srv.devOnly(srv.openAISleep)},
			"/wake_up": {http.MethodPost, srv.devOnly(srv.openAIWake)},
			"/health":  {http.MethodGet, empty},
		}
	})
}

// OmitTokenIDs makes the OpenAI server answer without choices[].token_ids
// and prompt_token_ids, as vLLM before 0.10.2 does.
func (s *Server) OmitTokenIDs(omit bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noIDs = omit
}

// SetDevMode turns the OpenAI server's development mode on (the default)
// or off: off, it answers 404 on /collective_rpc, /reset_prefix_cache,
// /sleep and /wake_up, as vLLM does without VLLM_SERVER_DEV_MODE=1.
func (s *Server) SetDevMode(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noDevMode = !on
}

// SetModel makes the OpenAI server refuse requests naming a model other
// than name with 404, as vLLM does; a request without a model is served.
func (s *Server) SetModel(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.model = name
}

// PrefixCacheResets counts the /reset_prefix_cache calls answered.
func (s *Server) PrefixCacheResets() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prefixes
}

// devOnly answers 404 in place of h without development mode.
func (s *Server) devOnly(h func(http.ResponseWriter, *http.Request, []byte)) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		s.mu.Lock()
		off := s.noDevMode
		s.mu.Unlock()
		if off {
			writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
			return
		}
		h(w, r, body)
	}
}

// openAIRequest is the part of CompletionRequest the server accepts.
type openAIRequest struct {
	Model                  string   `json:"model"`
	Prompt                 []int32  `json:"prompt"`
	N                      *int     `json:"n"`
	MaxTokens              *int     `json:"max_tokens"`
	Temperature            *float64 `json:"temperature"`
	TopP                   *float64 `json:"top_p"`
	TopK                   *int     `json:"top_k"`
	StopTokenIDs           []int    `json:"stop_token_ids"`
	IgnoreEOS              bool     `json:"ignore_eos"`
	Logprobs               *int     `json:"logprobs"`
	ReturnTokensAsTokenIDs bool     `json:"return_tokens_as_token_ids"`
	ReturnTokenIDs         bool     `json:"return_token_ids"`
	SkipSpecialTokens      *bool    `json:"skip_special_tokens"`
	Seed                   *int64   `json:"seed"`
}

var cmplID atomic.Int64

func (s *Server) openAICompletions(w http.ResponseWriter, _ *http.Request, body []byte) {
	var req openAIRequest
	if err := decodeStrict(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid request (this server takes a prompt of token ids): %v", err))
		return
	}
	s.mu.Lock()
	model, noIDs := s.model, s.noIDs
	s.mu.Unlock()
	if model != "" && req.Model != "" && req.Model != model {
		writeJSON(w, http.StatusNotFound, map[string]any{"error": map[string]any{
			"message": fmt.Sprintf("The model `%s` does not exist.", req.Model), "type": "NotFoundError", "param": "model", "code": 404}})
		return
	}
	if len(req.Prompt) == 0 {
		writeError(w, http.StatusBadRequest, "the prompt is empty")
		return
	}
	p := engines.Params{MaxNewTokens: 16, Temperature: 1, TopP: 1, StopTokenIDs: req.StopTokenIDs, IgnoreEOS: req.IgnoreEOS}
	n := 1
	if req.N != nil {
		n = *req.N
	}
	if req.MaxTokens != nil {
		p.MaxNewTokens = *req.MaxTokens
	}
	if req.Temperature != nil {
		p.Temperature = *req.Temperature
	}
	if req.TopP != nil {
		p.TopP = *req.TopP
	}
	if req.TopK != nil && *req.TopK > 0 {
		p.TopK = *req.TopK
	}
	if req.Seed != nil {
		p.Seed = *req.Seed
	}
	if n < 1 || p.MaxNewTokens < 1 || !(p.TopP > 0 && p.TopP <= 1) || p.Temperature < 0 {
		writeError(w, http.StatusBadRequest, "invalid sampling parameters")
		return
	}
	rs := s.sample(req.Prompt, n, p)
	if rs == nil {
		writeError(w, http.StatusInternalServerError, "the test sampler returned a malformed response")
		return
	}
	choices := make([]map[string]any, 0, n)
	completion := 0
	for j := n - 1; j >= 0; j-- {
		r := rs[j]
		completion += len(r.Tokens)
		finish := r.Finish
		if s.takeAbort() {
			finish = "abort"
		}
		var stopReason any
		if finish == engines.FinishStop && len(r.Tokens) > 0 && slices.Contains(p.StopTokenIDs, int(r.Tokens[len(r.Tokens)-1])) {
			stopReason = int(r.Tokens[len(r.Tokens)-1])
		}
		var logprobs any
		if req.Logprobs != nil {
			tokens := make([]string, len(r.Tokens))
			lps := make([]float64, len(r.Tokens))
			top := make([]map[string]float64, len(r.Tokens))
			offsets := make([]int, len(r.Tokens))
			for k, t := range r.Tokens {
				tokens[k] = "<" + strconv.Itoa(int(t)) + ">"
				if req.ReturnTokensAsTokenIDs {
					tokens[k] = "token_id:" + strconv.Itoa(int(t))
				}
				lps[k] = float64(r.LogProbs[k])
				top[k] = map[string]float64{tokens[k]: lps[k]}
			}
			logprobs = map[string]any{"tokens": tokens, "token_logprobs": lps, "top_logprobs": top, "text_offset": offsets}
		}
		c := map[string]any{"index": j, "text": "", "logprobs": logprobs, "finish_reason": finish, "stop_reason": stopReason, "prompt_logprobs": nil}
		if req.ReturnTokenIDs && !noIDs {
			c["token_ids"] = r.Tokens
			c["prompt_token_ids"] = req.Prompt
		}
		choices = append(choices, c)
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id":      "cmpl-" + strconv.FormatInt(cmplID.Add(1), 16),
		"object":  "text_completion",
		"created": time.Now().Unix(),
		"model":   req.Model,
		"choices": choices,
		"usage":   map[string]int{"prompt_tokens": len(req.Prompt), "completion_tokens": completion, "total_tokens": len(req.Prompt) + completion},
	})
}

func (s *Server) openAIRPC(w http.ResponseWriter, _ *http.Request, body []byte) {
	var req struct {
		Method  string          `json:"method"`
		Args    json.RawMessage `json:"args"`
		Kwargs  map[string]any  `json:"kwargs"`
		Timeout *float64        `json:"timeout"`
	}
	if err := decodeStrict(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid request: %v", err))
		return
	}
	if req.Method != "reload_weights" {
		writeError(w, http.StatusInternalServerError, fmt.Sprintf("the test server has no method %q", req.Method))
		return
	}
	dir, ok := req.Kwargs["weights_path"].(string)
	if !ok {
		writeError(w, http.StatusInternalServerError, "reload_weights needs kwargs.weights_path")
		return
	}
	s.record(func() { s.modelPath, s.reloads = dir, s.reloads+1 })
	writeJSON(w, http.StatusOK, map[string]any{"results": []any{nil}})
}

func (s *Server) openAISleep(w http.ResponseWriter, r *http.Request, _ []byte) {
	if level := r.URL.Query().Get("level"); level != "" && level != "1" && level != "2" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("level must be 1 or 2, got %q", level))
		return
	}
	s.record(func() { s.released, s.releases = true, s.releases+1 })
	w.WriteHeader(http.StatusOK)
}

func (s *Server) openAIWake(w http.ResponseWriter, _ *http.Request, _ []byte) {
	s.record(func() { s.released, s.resumes = false, s.resumes+1 })
	w.WriteHeader(http.StatusOK)
}
