package cli

import (
	"encoding/json"
	"errors"
	"io"

	"github.com/rlpipe/rlpipe/jobs"
	"github.com/rlpipe/rlpipe/spec"
)

// writeJSON writes v to w as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// problem is one validate error as JSON; Line and Col are 0 where the
// error has no position in the spec.
type problem struct {
	File    string `json:"file"`
	Line    int    `json:"line"`
	Col     int    `json:"col"`
	Message string `json:"message"`
}

// validateResult is what validate --json prints.
type validateResult struct {
	OK     bool      `json:"ok"`
	File   string    `json:"file"`
	Models int       `json:"models,omitempty"`
	Setup  int       `json:"setup_stages,omitempty"`
	Step   int       `json:"step_stages,omitempty"`
	Errors []problem `json:"errors"`
}

// validateJSON prints the outcome of loading path, l or err, as JSON on
// stdout and returns validate's exit code for it: exitInvalid for spec
// errors, exitFailed for any other error.
func (env *cli) validateJSON(path string, l *loaded, err error) int {
	res := validateResult{OK: err == nil, File: path, Errors: []problem{}}
	code := exitOK
	var (
		list spec.Errors
		one  *spec.Error
	)
	switch {
	case err == nil:
		res.Models, res.Setup, res.Step = len(l.spec.Models), len(l.spec.Setup), len(l.spec.Step)
	case errors.As(err, &list):
		code = exitInvalid
		for _, e := range list {
			if e != nil {
				res.Errors = append(res.Errors, problem{e.Pos.File, e.Pos.Line, e.Pos.Col, e.Msg})
			}
		}
	case errors.As(err, &one):
		code = exitInvalid
		res.Errors = append(res.Errors, problem{one.Pos.File, one.Pos.Line, one.Pos.Col, one.Msg})
	default:
		code = exitFailed
		res.Errors = append(res.Errors, problem{File: path, Message: err.Error()})
	}
	if err := writeJSON(env.stdout, res); err != nil {
		return env.report(err)
	}
	return code
}

// runJSON is what jobs show --json prints: the run's record, its
// directory, its committed checkpoints' steps and its per-step metrics.
type runJSON struct {
	jobs.Meta
	Dir         string         `json:"dir"`
	Checkpoints []int          `json:"checkpoints"`
	Metrics     []jobs.Metrics `json:"metrics"`
}
