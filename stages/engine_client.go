package stages

import (
	"fmt"
	"math"
	"time"

	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages/engines"
)

// newEngineClient returns the client of an HTTP engine, or nil for "".
func newEngineClient(engine, url, served string, o engines.Options) (engines.Client, error) {
	o.Model = served
	switch engine {
	case "":
		return nil, nil
	case EngineSGLang:
		return engines.NewSGLang(url, o)
	case EngineOpenAI:
		return engines.NewOpenAI(url, o)
	}
	return nil, fmt.Errorf("unknown engine %q (%s or %s)", engine, EngineSGLang, EngineOpenAI)
}

// controlClient checks the engine keys (engine, url, timeout_s) of a stage
// that controls an engine (push_weights, sleep, wake) and returns the
// engine's client, nil without one.
func controlClient(vc *ValidateContext, engine, url string, timeoutS float64) (engines.Client, spec.Errors) {
	var errs spec.Errors
	if !(timeoutS > 0) || math.IsInf(timeoutS, 0) {
		errs = append(errs, vc.Errorf("timeout_s", "timeout_s must be positive, got %v", timeoutS))
	}
	if engine == "" {
		if url != "" {
			errs = append(errs, vc.Errorf("url", "url names an engine, but engine is not set (sglang or openai)"))
		}
		return nil, errs
	}
	if url == "" {
		errs = append(errs, vc.Errorf("url", "the %s engine needs url", engine))
		return nil, errs
	}
	c, err := newEngineClient(engine, url, "", engines.Options{Timeout: time.Duration(timeoutS * float64(time.Second)), Concurrency: 1})
	if err != nil {
		errs = append(errs, vc.Errorf("engine", "%v", err))
	}
	return c, errs
}
