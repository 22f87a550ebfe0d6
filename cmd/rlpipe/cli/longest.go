package cli

import (
	"fmt"
	"io"

	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
)

// longest is the outcome of `rlpipe plan --longest`: the longest sample,
// in multiples of Step tokens, whose job fits, and the next length, which
// does not.
type longest struct {
	Step int `json:"step"`
	// Tokens is the longest sample that fits (0: not even Step tokens
	// fit), with the data.max_tokens_per_gpu its plan used.
	Tokens          int `json:"tokens"`
	MaxTokensPerGPU int `json:"max_tokens_per_gpu"`
	// Next is Tokens + Step, which does not fit, and why: its device
	// total (NextBytes) or the problem that resolving it reported; 0 when
	// Tokens is the largest data.max_seq_len allows.
	Next      int    `json:"next_tokens,omitempty"`
	NextBytes int64  `json:"next_device_total_bytes,omitempty"`
	NextWhy   string `json:"next_why,omitempty"`
}

// lengthPlan is the job and its plan with samples of a given length.
type lengthPlan struct {
	l     *loaded
	p     *plan.Plan
	fits  bool
	total int64
	why   string // the problem resolving or planning it reported, if any
}

// findLongest plans the spec at path with data.max_seq_len set to
// multiples of step tokens, and data.max_tokens_per_gpu to the rows such a
// sample puts on each of mesh.cp ranks (one sample a micro-batch), and
// returns the longest that fits (fits decides, from the plan and the job)
// with its plan, or, when none does, the shortest length tried (its plan
// nil when it could not be planned, for the reason in why). The spec's own
// length must resolve; another that does not resolve counts as not
// fitting, for the reason given. Memory grows with the length, so the search doubles the length
// until it does not fit and then bisects.
func findLongest(path, gpuValue string, step int, fits func(*loaded, *plan.Plan) bool) (*lengthPlan, longest, error) {
	res := longest{Step: step}
	base, err := load(path, gpuValue, stages.CheckPlan)
	if err != nil {
		return nil, res, err
	}
	for _, st := range base.job.Order {
		if pk, ok := base.job.Stages[st.ID].(*stages.Pack); ok && pk.MaxTokensPerGPU > 0 {
			return nil, res, fmt.Errorf("--longest varies data.max_tokens_per_gpu, but stage %q sets its own max_tokens_per_gpu (%d): remove it to search", st.ID, pk.MaxTokensPerGPU)
		}
	}
	cp := base.spec.Mesh.CPSize()
	at := func(n int) (*lengthPlan, error) {
		s, err := spec.Load(path)
		if err != nil {
			return nil, err
		}
		s.Data.MaxSeqLen = n
		s.Data.MaxTokensPerGPU = spec.SeqRows(n, cp)
		lp := &lengthPlan{}
		// The rollout file holds samples of the spec's length, not of n:
		// base checked it.
		if lp.l, err = resolveSpec(s, gpuValue, stages.CheckShape); err != nil {
			lp.why = err.Error()
			return lp, nil
		}
		if lp.p, err = stages.Plan(lp.l.job); err != nil {
			lp.why = err.Error()
			return lp, nil
		}
		lp.fits, lp.total = fits(lp.l, lp.p), lp.p.DeviceTotal()
		return lp, nil
	}
	bound := spec.MaxTokens / step
	var best *lengthPlan
	lo, hi := 0, 0 // in steps: lo fits (0: nothing yet), hi does not (0: unknown)
	var failed *lengthPlan
	for k := 1; ; k = min(2*k, bound) {
		lp, err := at(k * step)
		if err != nil {
			return nil, res, err
		}
		if !lp.fits {
			hi, failed = k, lp
			break
		}
		lo, best = k, lp
		if k == bound {
			break
		}
	}
	for hi > 0 && hi-lo > 1 {
		mid := (lo + hi) / 2
		lp, err := at(mid * step)
		if err != nil {
			return nil, res, err
		}
		if lp.fits {
			lo, best = mid, lp
		} else {
			hi, failed = mid, lp
		}
	}
	if failed != nil {
		res.Next, res.NextBytes, res.NextWhy = hi*step, failed.total, failed.why
	}
	if best == nil {
		return failed, res, nil
	}
	res.Tokens, res.MaxTokensPerGPU = lo*step, best.l.spec.Data.MaxTokensPerGPU
	return best, res, nil
}

// write prints the search's outcome under the plan it rendered.
func (r longest) write(w io.Writer, gpuBytes int64) {
	if r.Tokens == 0 {
		fmt.Fprintf(w, "LONGEST: not even samples of %d tokens fit", r.Step)
	} else {
		fmt.Fprintf(w, "LONGEST: samples of %d tokens fit (data.max_seq_len %d, max_tokens_per_gpu %d; searched in steps of %d)",
			r.Tokens, r.Tokens, r.MaxTokensPerGPU, r.Step)
	}
	switch {
	case r.Next == 0:
		fmt.Fprintf(w, "; %d is the longest data.max_seq_len allows\n", r.Tokens)
	case r.NextWhy != "":
		fmt.Fprintf(w, "; %d tokens: %s\n", r.Next, r.NextWhy)
	default:
		fmt.Fprintf(w, "; %d tokens do not: device total %s GiB of %s GiB\n", r.Next, plan.GiB(r.NextBytes), plan.GiB(gpuBytes))
	}
}
