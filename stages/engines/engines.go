package engines

import (
	"context"
	"net/http"
	"time"
)

// The engine kinds, as errors name them.
const (
	KindSGLang = "sglang"
	KindOpenAI = "openai"
)

// The defaults of Options.
const (
	DefaultConcurrency = 64
	DefaultTimeout     = 10 * time.Minute
	DefaultRetries     = 3
)

// The backoff between attempts: it starts at backoffBase and doubles up to
// backoffMax.
const (
	backoffBase = 500 * time.Millisecond
	backoffMax  = 8 * time.Second
)

// Params are the sampling parameters of a generation call.
type Params struct {
	// MaxNewTokens bounds each response; it must be at least 1.
	MaxNewTokens int
	// Temperature is the sampling temperature (0: greedy).
	Temperature float64
	// TopP is the nucleus probability mass; 1 is off, and 0 is taken as 1.
	TopP float64
	// TopK keeps the k likeliest tokens; 0 is off (sent as -1 to SGLang,
	// omitted for OpenAI).
	TopK int
	// StopTokenIDs end a response besides the model's EOS (unless
	// IgnoreEOS); they are omitted from the request when empty.
	StopTokenIDs []int
	// IgnoreEOS makes the engine go on past the model's EOS token.
	IgnoreEOS bool
	// Seed is the base seed: request i gets Seed+i where the engine takes a
	// seed (SGLang's sampling_seed, one request per prompt and sample, i =
	// prompt*n + sample; OpenAI's seed, one request per prompt, i = prompt).
	// Seed 0 sends no seed at all: the engine samples unseeded, and SGLang
	// versions that do not know sampling_seed accept the request.
	Seed int64
}

// Response is one sampled response.
type Response struct {
	// Tokens are the generated token ids, the final stop or EOS token
	// included (engines do not trim it from ids).
	Tokens []int32
	// LogProbs are the engine's log-prob of each token.
	LogProbs []float32
	// Finish is "stop" or "length"; an aborted request is an error.
	Finish string
}

// The finish reasons of a Response.
const (
	FinishStop   = "stop"
	FinishLength = "length"
)

// Options bound a client's requests.
type Options struct {
	// Concurrency is the number of generation requests in flight at once
	// over all the client's Generate calls; 0 takes DefaultConcurrency.
	// Control requests (reload, release, resume, health) are not counted.
	Concurrency int
	// Timeout bounds each attempt of a request, the reading of its answer
	// included; 0 takes DefaultTimeout.
	Timeout time.Duration
	// Retries is the number of retries of a failed request (network errors
	// and timeouts, 429 and 5xx answers) after an exponential backoff from
	// 0.5 s doubling up to 8 s (longer where the server's Retry-After asks,
	// up to 8 s). 0 takes DefaultRetries; a negative value disables
	// retries. Other answers (4xx but 429, malformed bodies, aborted
	// requests) fail at once. Health is never retried.
	Retries int
	// Model is the "model" field of OpenAI requests; empty omits it (the
	// server then uses the model it serves).
	Model string
	// Client sends the requests; nil takes a client whose transport keeps
	// Concurrency connections to the engine alive, dials within 30 s and
	// honours the proxy environment variables (as net/http does).
	Client *http.Client
}

// Client generates from one engine.
type Client interface {
	// Generate samples n responses to each prompt; the result is
	// [prompt][sample].
	Generate(ctx context.Context, prompts [][]int32, n int, p Params) ([][]Response, error)
	// ReloadFromDisk makes the engine load the HF checkpoint in dir (a
	// path the engine's filesystem sees).
	ReloadFromDisk(ctx context.Context, dir string) error
	// ReleaseMemory frees the engine's GPU memory (weights and KV cache)
	// for a colocated trainer.
	ReleaseMemory(ctx context.Context) error
	// ResumeMemory restores what ReleaseMemory freed.
	ResumeMemory(ctx context.Context) error
	// Health reports whether the engine answers.
	Health(ctx context.Context) error
}
