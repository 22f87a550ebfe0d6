// Package rollout reads, validates and lays out RL rollout samples for
// training: the JSONL rollout format (rlpipe's own dialect and slime's field
// names), prompt groups, token-balanced splitting of an optimizer step over
// data-parallel ranks, micro-batching under a token budget, and varlen packing
// into one flat token row with cu_seqlens and per-sample position ids.
//
// The file format and the packing rules are described in docs/data.md.
package rollout

import (
	"fmt"
	"math"
	"strings"
)

// MaxTokenID is the largest token id accepted anywhere in this package; token
// ids are stored as int32.
const MaxTokenID = math.MaxInt32

// maxReported is how many errors an ErrorList prints before summarising the
// rest as "... and N more".
const maxReported = 20

// Sample is one rollout: a prompt followed by a generated response, scored by
// a reward.
type Sample struct {
	// Tokens holds the prompt ids followed by the response ids. Token id 0 is
	// an ordinary token; nothing in this package treats it as padding.
	Tokens []int32
	// ResponseLength is R, the number of response tokens at the end of
	// Tokens. 0 < R < len(Tokens): there is at least one prompt token.
	ResponseLength int
	// Reward is the scalar reward of the whole response (finite).
	Reward float64
	// LossMask has R entries in [0, 1]; it is all ones when the file gave
	// none.
	LossMask []float32
	// RolloutLogProbs holds the rollout engine's log-probs of the R response
	// tokens, or nil when the file gave none.
	RolloutLogProbs []float32
	// Group is the prompt group id: the samples generated from one prompt
	// share it.
	Group int
	// Index is the sample's 0-based position in the file (blank lines are not
	// counted) or in the generated slice.
	Index int
	// Line is the 1-based source line the sample was read from, or 0 for a
	// sample that was not read from a file.
	Line int
}

// PromptLength returns the number of prompt tokens, len(Tokens) − R.
func (s *Sample) PromptLength() int { return len(s.Tokens) - s.ResponseLength }

// Response returns the response token ids, the last R entries of Tokens. It
// returns nil when ResponseLength is out of range.
func (s *Sample) Response() []int32 {
	if s.ResponseLength < 0 || s.ResponseLength > len(s.Tokens) {
		return nil
	}
	return s.Tokens[len(s.Tokens)-s.ResponseLength:]
}

// Validate checks the invariants that Decode enforces on a sample: a
// non-empty token list of ids in [0, MaxTokenID], 0 < R < len(Tokens), a
// finite reward, a loss mask of R entries in [0, 1], rollout log-probs (when
// present) of R finite entries ≤ 0, and a group id ≥ 0. It reports every
// violation, one per line.
func (s *Sample) Validate() error {
	var msgs []string
	add := func(format string, args ...any) { msgs = append(msgs, fmt.Sprintf(format, args...)) }
	n, r := len(s.Tokens), s.ResponseLength
	switch {
	case n == 0:
		add("tokens is empty")
	case r <= 0:
		add("response_length must be positive, got %d", r)
	case r >= n:
		add("response_length %d must be less than the %d tokens (at least one prompt token is needed)", r, n)
	}
	for i, t := range s.Tokens {
		if t < 0 {
			add("tokens[%d]: %d is negative", i, t)
			break
		}
	}
	if math.IsNaN(s.Reward) || math.IsInf(s.Reward, 0) {
		add("reward %v is not finite", s.Reward)
	}
	if len(s.LossMask) != r {
		add("loss_mask has %d entries, want response_length %d", len(s.LossMask), r)
	}
	for i, m := range s.LossMask {
		if !(m >= 0 && m <= 1) {
			add("loss_mask[%d]: %v is outside [0, 1]", i, m)
			break
		}
	}
	if s.RolloutLogProbs != nil {
		if len(s.RolloutLogProbs) != r {
			add("rollout_log_probs has %d entries, want response_length %d", len(s.RolloutLogProbs), r)
		}
		for i, v := range s.RolloutLogProbs {
			if !(v <= 0) || math.IsInf(float64(v), 0) {
				add("rollout_log_probs[%d]: %v is not a finite value ≤ 0", i, v)
				break
			}
		}
	}
	if s.Group < 0 || s.Group > math.MaxInt32 {
		add("group %d is outside [0, %d]", s.Group, math.MaxInt32)
	}
	if len(msgs) == 0 {
		return nil
	}
	where := fmt.Sprintf("sample %d", s.Index)
	if s.Line > 0 {
		where += fmt.Sprintf(" (line %d)", s.Line)
	}
	return fmt.Errorf("%s: %s", where, strings.Join(msgs, "; "))
}

// Lengths returns len(Tokens) of every sample, the weights used by Balance,
// MicroBatches and Plan.
func Lengths(samples []Sample) []int {
	out := make([]int, len(samples))
	for i := range samples {
		out[i] = len(samples[i].Tokens)
	}
	return out
}

// CheckVocab reports every sample holding a token id ≥ vocab, naming its line
// (or index) and the first offending position.
func CheckVocab(samples []Sample, vocab int) error {
	if vocab <= 0 {
		return fmt.Errorf("vocab size must be positive, got %d", vocab)
	}
	var errs ErrorList
	for i := range samples {
		s := &samples[i]
		for j, t := range s.Tokens {
			if int(t) >= vocab {
				errs = append(errs, &LineError{Line: s.Line,
					Msg: fmt.Sprintf("sample %d: tokens[%d]: %d is outside the vocabulary of %d", s.Index, j, t, vocab)})
				break
			}
		}
	}
	return errs.err()
}

// LineError is one problem found in an input, located by file name and
// 1-based line. Name or Line may be empty/zero when unknown.
type LineError struct {
	Name string
	Line int
	Msg  string
}

// Error formats the error as "name:line: message".
func (e *LineError) Error() string {
	switch {
	case e.Name != "" && e.Line > 0:
		return fmt.Sprintf("%s:%d: %s", e.Name, e.Line, e.Msg)
	case e.Line > 0:
		return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
	case e.Name != "":
		return e.Name + ": " + e.Msg
	}
	return e.Msg
}

// ErrorList collects every problem found in one input. Its message lists the
// first 20, one per line, followed by "... and N more"; the slice itself
// keeps all of them.
type ErrorList []*LineError

// Error lists the first 20 errors, one per line.
func (l ErrorList) Error() string {
	var b strings.Builder
	for i, e := range l {
		if i == maxReported {
			fmt.Fprintf(&b, "\n... and %d more", len(l)-maxReported)
			break
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Unwrap returns every error of the list, for errors.Is and errors.As.
func (l ErrorList) Unwrap() []error {
	out := make([]error, len(l))
	for i, e := range l {
		out[i] = e
	}
	return out
}

// err returns l as an error, or nil when it is empty (never a typed nil).
func (l ErrorList) err() error {
	if len(l) == 0 {
		return nil
	}
	return l
}
