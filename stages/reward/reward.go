// Package reward holds the rewards of the generate stage: the functions that
// score the samples an inference engine produced in a training step.
//
// A reward scores a whole batch at once, the way math and code verifiers are
// run, and returns one finite number per sample, in order. The `reward:` block
// of a generate stage (Config) names exactly one source:
//
//   - expr: an expr-lang expression over one sample (see the environment
//     below), compiled once and evaluated for every sample in-process.
//   - command: the argv of a program, started once per batch, that speaks the
//     JSONL protocol below over its stdin and stdout.
//   - url: an HTTP endpoint that receives the same JSONL in a POST and answers
//     with the same lines the program would print.
//   - plugin: a Scorer registered from Go with Register.
//
// # Expression environment
//
// An expression sees one sample through these variables:
//
//	response         []int           generated token ids
//	prompt           []int           prompt token ids
//	response_length  int             len(response)
//	prompt_length    int             len(prompt)
//	finish           string          "stop" or "length"
//	label            map[string]any  the prompt line's other JSON fields
//	group            int             the prompt group id
//
// It must return a number (int or float) or a bool (true scores 1, false 0),
// for example `count(response, # < 64) / len(response)`,
// `finish == "stop" ? 1 : 0` or `label.answer == 3`. An expression whose
// type is only known at run time (say `label.score`) is accepted by New and
// checked for every sample.
//
// # JSONL protocol
//
// Command and URL rewards receive the batch as JSON Lines, one object per
// sample, in batch order:
//
//	{"index": 0, "group": 0, "prompt_tokens": [1, 2], "response_tokens": [3, 4], "finish": "stop", "label": {"answer": 3}}
//
// index and group are the Sample's Index and Group, finish is "stop" or
// "length", and label holds the prompt line's other fields ({} when there
// are none). The answer is exactly one line per input line, in the same
// order: either a JSON number (`0.5`) or a JSON object with a numeric
// "reward" field (`{"reward": 0.5, "detail": "..."}`; other fields are
// ignored). A final newline is optional; blank lines count as lines and are
// errors, so diagnostics belong on stderr, not stdout. Rewards must be finite.
//
// A command is started once per Score call with the batch written to its
// stdin, which is then closed; it must print the answer on stdout and exit
// with status 0. Its stdin is written while its stdout is read, so a program
// may answer line by line as it reads. It runs in its own process group,
// which is killed when the call times out (TimeoutS, 300 s by default) or
// its context is cancelled. Errors name the command, the line at fault when
// there is one, and end with the last 2 KiB of its stderr.
//
// A URL receives the batch as the body of a POST with Content-Type
// application/x-ndjson and must answer 2xx with the same body a command
// would print. Each HTTP request is bounded by TimeoutS; requests that fail
// on the network (a timeout included), with a 5xx or with 429 are retried
// up to Retries times with exponential backoff (0.5 s, 1 s, 2 s, ... up to
// 10 s, or longer when a Retry-After header asks for it, up to 60 s). Other
// statuses and malformed answers are not retried. Errors name the URL, the
// HTTP status and the start of the response body.
//
// A batch with no samples is scored without starting a command or calling a
// URL.
package reward

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os/exec"
	"time"
)

// Sample is what a reward sees of one generated sample.
type Sample struct {
	Index    int            // index in the step's rollout batch
	Group    int            // prompt group id: the samples of one prompt share it
	Prompt   []int32        // prompt token ids
	Response []int32        // generated token ids
	Finish   string         // why generation stopped: "stop" (a stop token or string) or "length" (max_new_tokens)
	Labels   map[string]any // the prompt line's other JSON fields (decoded with encoding/json: float64, string, bool, []any, map[string]any, nil)
}

// Scorer scores a batch: one finite reward per sample, in order.
type Scorer interface {
	Score(ctx context.Context, samples []Sample) ([]float64, error)
}

// Config is the `reward:` block of a generate stage: exactly one of Expr,
// Command, URL, Plugin.
type Config struct {
	Expr     string   `yaml:"expr"`      // expr-lang expression returning a number (int or float) or bool (true = 1)
	Command  []string `yaml:"command"`   // argv of a program that scores a batch over stdin/stdout JSONL
	URL      string   `yaml:"url"`       // an HTTP endpoint that scores a batch: POST JSONL, JSONL back
	Plugin   string   `yaml:"plugin"`    // a reward registered from Go with Register
	TimeoutS float64  `yaml:"timeout_s"` // per scoring call for Command and URL; 0 means 300
	Retries  int      `yaml:"retries"`   // URL: retries of a failed call (network error, 5xx, 429), with exponential backoff; default 0
}

// DefaultTimeout bounds a command run or an HTTP request when
// Config.TimeoutS is 0.
const DefaultTimeout = 300 * time.Second

// ConfigError is an error of New about one key of the `reward:` block, so
// that the caller can point at it in the YAML. Field is the key ("command",
// "url", "plugin", "timeout_s", "retries"), or "" when the error is about the
// block as a whole (no source or more than one). Errors about the expression
// are *ExprError instead.
type ConfigError struct {
	Field string
	Err   error
}

// Error implements error.
func (e *ConfigError) Error() string {
	if e.Field == "" {
		return "reward: " + e.Err.Error()
	}
	return "reward." + e.Field + ": " + e.Err.Error()
}

// Unwrap returns the underlying error.
func (e *ConfigError) Unwrap() error { return e.Err }

// configErrorf returns a *ConfigError about field.
func configErrorf(field, format string, args ...any) error {
	return &ConfigError{Field: field, Err: fmt.Errorf(format, args...)}
}

// New builds the scorer of cfg, checking what can be checked now: exactly
// one source set, the expression compiles against the sample environment
// with a numeric or bool result (an *ExprError carrying the 0-based byte
// offset inside the expression, so the caller can point at the exact
// character in the YAML), the command's program exists (exec.LookPath), the
// URL parses with http/https, the plugin is registered (with a did-you-mean).
// TimeoutS must be finite and non-negative and is accepted only with Command
// or URL; Retries must be non-negative and is accepted only with URL. Every
// other error is a *ConfigError.
func New(cfg Config) (Scorer, error) {
	var set []string
	if cfg.Expr != "" {
		set = append(set, "expr")
	}
	if cfg.Command != nil {
		set = append(set, "command")
	}
	if cfg.URL != "" {
		set = append(set, "url")
	}
	if cfg.Plugin != "" {
		set = append(set, "plugin")
	}
	switch len(set) {
	case 0:
		return nil, configErrorf("", "set one of expr, command, url or plugin")
	case 1:
	default:
		return nil, configErrorf("", "set only one of expr, command, url or plugin, not %s and %s", set[0], set[1])
	}
	source := set[0]

	if math.IsNaN(cfg.TimeoutS) || math.IsInf(cfg.TimeoutS, 0) || cfg.TimeoutS < 0 {
		return nil, configErrorf("timeout_s", "want a finite number of seconds >= 0, got %v", cfg.TimeoutS)
	}
	if cfg.TimeoutS != 0 && source != "command" && source != "url" {
		return nil, configErrorf("timeout_s", "applies only to a command or url reward, not to %s", source)
	}
	if cfg.Retries < 0 {
		return nil, configErrorf("retries", "want a number >= 0, got %d", cfg.Retries)
	}
	if cfg.Retries != 0 && source != "url" {
		return nil, configErrorf("retries", "applies only to a url reward, not to %s", source)
	}
	timeout := DefaultTimeout
	if cfg.TimeoutS > 0 {
		timeout = time.Duration(cfg.TimeoutS * float64(time.Second))
		if timeout <= 0 {
			return nil, configErrorf("timeout_s", "%v seconds is too short", cfg.TimeoutS)
		}
	}

	switch source {
	case "expr":
		return newExprScorer(cfg.Expr)
	case "command":
		if len(cfg.Command) == 0 || cfg.Command[0] == "" {
			return nil, configErrorf("command", "want the argv of a program, got an empty list")
		}
		path, err := exec.LookPath(cfg.Command[0])
		if err != nil {
			var ee *exec.Error
			if errors.As(err, &ee) {
				err = ee.Err // ee repeats the program's name
			}
			return nil, &ConfigError{Field: "command", Err: fmt.Errorf("program %q: %w", cfg.Command[0], err)}
		}
		return newCommandScorer(path, cfg.Command, timeout), nil
	case "url":
		u, err := url.Parse(cfg.URL)
		if err != nil {
			return nil, &ConfigError{Field: "url", Err: fmt.Errorf("invalid url: %w", err)}
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return nil, configErrorf("url", "want an http or https url, got %q", cfg.URL)
		}
		if u.Host == "" {
			return nil, configErrorf("url", "url %q has no host", cfg.URL)
		}
		return newHTTPScorer(u.String(), timeout, cfg.Retries), nil
	default:
		return lookupPlugin(cfg.Plugin)
	}
}

// checkFinite returns an error when r is NaN or infinite.
func checkFinite(r float64) error {
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return fmt.Errorf("non-finite reward %v", r)
	}
	return nil
}
