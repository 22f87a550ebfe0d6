package enginetest

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/rlpipe/rlpipe/stages/engines"
)

// NewSGLang starts a server that speaks SGLang's native API (v0.5):
//
//   - POST /generate with {"input_ids": [...], "sampling_params": {...},
//     "return_logprob": true} (unknown fields are refused with 400, as is a
//     list of prompts) answers one response as {"text", "output_ids",
//     "meta_info": {"id", "finish_reason": {"type": "stop", "matched": id}
//     or {"type": "length", "length": n} or {"type": "abort", "message"},
//     "prompt_tokens", "completion_tokens", "output_token_logprobs":
//     [[logprob, id, null], ...]}}. Its output_ids leave out a final
//     matched stop token, as some SGLang versions do, so that a client
//     reading them instead of output_token_logprobs fails.
//   - POST /update_weights_from_disk with {"model_path": dir} answers
//     {"success": true, "message", "num_paused_requests": 0}.
//   - POST /release_memory_occupation and /resume_memory_occupation with
//     {} answer null.
//   - GET /health_generate and /health answer 200 with an empty body.
//
// A nil sampler is Counting.
func NewSGLang(s Sampler) *Server {
	return newServer(s, func(srv *Server) {
		srv.routes = map[string]route{
			"/generate":                  {http.MethodPost, srv.sglangGenerate},
			"/update_weights_from_disk":  {http.MethodPost, srv.sglangUpdate},
			"/release_memory_occupation": {http.MethodPost, srv.sglangMemory(true)},
			"/resume_memory_occupation":  {http.MethodPost, srv.sglangMemory(false)},
			"/health_generate":           {http.MethodGet, empty},
			"/health":                    {http.MethodGet, empty},
		}
	})
}

// empty answers 200 with no body.
func empty(w http.ResponseWriter, _ *http.Request, _ []byte) { w.WriteHeader(http.StatusOK) }

// sglangRequest is the part of GenerateReqInput the server accepts.
type sglangRequest struct {
	InputIDs       []int32 `json:"input_ids"`
	SamplingParams *struct {
		MaxNewTokens      *int     `json:"max_new_tokens"`
		Temperature       *float64 `json:"temperature"`
		TopP              *float64 `json:"top_p"`
		TopK              *int     `json:"top_k"`
		StopTokenIDs      []int    `json:"stop_token_ids"`
		IgnoreEOS         bool     `json:"ignore_eos"`
		NoStopTrim        bool     `json:"no_stop_trim"`
		SkipSpecialTokens *bool    `json:"skip_special_tokens"`
		SamplingSeed      *int64   `json:"sampling_seed"`
	} `json:"sampling_params"`
	ReturnLogprob bool `json:"return_logprob"`
}

var rid atomic.Int64

func (s *Server) sglangGenerate(w http.ResponseWriter, _ *http.Request, body []byte) {
	var req sglangRequest
	if err := decodeStrict(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid request: %v", err))
		return
	}
	if len(req.InputIDs) == 0 {
		writeError(w, http.StatusBadRequest, "input_ids is empty")
		return
	}
	p := engines.Params{MaxNewTokens: 128, Temperature: 1, TopP: 1}
	if sp := req.SamplingParams; sp != nil {
		if sp.MaxNewTokens != nil {
			p.MaxNewTokens = *sp.MaxNewTokens
		}
		if sp.Temperature != nil {
			p.Temperature = *sp.Temperature
		}
		if sp.TopP != nil {
			p.TopP = *sp.TopP
		}
		if sp.TopK != nil && *sp.TopK != -1 {
			p.TopK = *sp.TopK
		}
		if sp.SamplingSeed != nil {
			p.Seed = *sp.SamplingSeed
		}
		p.StopTokenIDs, p.IgnoreEOS = sp.StopTokenIDs, sp.IgnoreEOS
		if sp.TopK != nil && *sp.TopK < 1 && *sp.TopK != -1 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("top_k must be -1 (disable) or at least 1, got %d.", *sp.TopK))
			return
		}
	}
	if !(p.TopP > 0 && p.TopP <= 1) || p.Temperature < 0 || p.MaxNewTokens < 0 {
		writeError(w, http.StatusBadRequest, "invalid sampling_params")
		return
	}
	rs := s.sample(req.InputIDs, 1, p)
	if rs == nil {
		writeError(w, http.StatusInternalServerError, "the test sampler returned a malformed response")
		return
	}
	r := rs[0]
	finish := map[string]any{"type": r.Finish}
	switch {
	case s.takeAbort():
		finish = map[string]any{"type": "abort", "message": "Abort by test server.", "status_code": 503, "err_type": nil}
	case r.Finish == engines.FinishLength:
		finish["length"] = len(r.Tokens)
	default:
		matched := 0
		if len(r.Tokens) > 0 {
			matched = int(r.Tokens[len(r.Tokens)-1])
		}
		finish["matched"] = matched
	}
	outputIDs := r.Tokens
	if r.Finish == engines.FinishStop && len(outputIDs) > 0 {
		outputIDs = outputIDs[:len(outputIDs)-1]
	}
	meta := map[string]any{
		"id":                strconv.FormatInt(rid.Add(1), 16),
		"finish_reason":     finish,
		"prompt_tokens":     len(req.InputIDs),
		"completion_tokens": len(r.Tokens),
		"cached_tokens":     0,
		"e2e_latency":       0.001,
	}
	if req.ReturnLogprob {
		entries := make([][3]any, len(r.Tokens))
		for k, t := range r.Tokens {
			entries[k] = [3]any{float64(r.LogProbs[k]), int(t), nil}
		}
		meta["output_token_logprobs"] = entries
		meta["input_token_logprobs"] = [][3]any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"text": "", "output_ids": outputIDs, "meta_info": meta})
}

func (s *Server) sglangUpdate(w http.ResponseWriter, _ *http.Request, body []byte) {
	var req struct {
		ModelPath *string `json:"model_path"`
	}
	err := decodeStrict(body, &req)
	if err == nil && req.ModelPath == nil {
		err = errors.New("model_path is missing")
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"success": false, "message": fmt.Sprintf("invalid request: %v", err), "num_paused_requests": 0})
		return
	}
	s.record(func() { s.modelPath, s.reloads = *req.ModelPath, s.reloads+1 })
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "message": "Succeeded to update model weights.", "num_paused_requests": 0})
}

// sglangMemory handles the release (release true) and resume endpoints.
func (s *Server) sglangMemory(release bool) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, _ *http.Request, body []byte) {
		var req map[string]any
		if err := decodeStrict(body, &req); err != nil || req == nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("want a JSON object, got %q", body))
			return
		}
		s.record(func() {
			s.released = release
			if release {
				s.releases++
			} else {
				s.resumes++
			}
		})
		writeJSON(w, http.StatusOK, nil)
	}
}
