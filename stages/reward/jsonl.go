package reward

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"
)

// This file holds the JSONL protocol that command and URL rewards share: the
// batch written as one object per sample, and the answer read back as one
// reward per line.

// wireSample is one line of the batch sent to a command or URL.
type wireSample struct {
	Index          int            `json:"index"`
	Group          int            `json:"group"`
	PromptTokens   []int32        `json:"prompt_tokens"`
	ResponseTokens []int32        `json:"response_tokens"`
	Finish         string         `json:"finish"`
	Label          map[string]any `json:"label"`
}

// encodeBatch returns the JSONL of samples, one object per line.
func encodeBatch(samples []Sample) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	for i := range samples {
		s := &samples[i]
		w := wireSample{
			Index:          s.Index,
			Group:          s.Group,
			PromptTokens:   s.Prompt,
			ResponseTokens: s.Response,
			Finish:         s.Finish,
			Label:          s.Labels,
		}
		if w.PromptTokens == nil {
			w.PromptTokens = []int32{}
		}
		if w.ResponseTokens == nil {
			w.ResponseTokens = []int32{}
		}
		if w.Label == nil {
			w.Label = map[string]any{}
		}
		if err := enc.Encode(&w); err != nil { // Encode ends the line with '\n'
			return nil, fmt.Errorf("encoding sample %d: %w", s.Index, err)
		}
	}
	return buf.Bytes(), nil
}

// maxLineBytes bounds one line of an answer.
const maxLineBytes = 1 << 20

// LineError is an error in one line of the answer of a command or URL.
// Line is 1-based.
type LineError struct {
	Line int
	Msg  string
}

// Error implements error.
func (e *LineError) Error() string { return fmt.Sprintf("line %d: %s", e.Line, e.Msg) }

// CountError is an answer of a command or URL with a number of lines other
// than the number of samples.
type CountError struct {
	Lines, Samples int
}

// Error implements error.
func (e *CountError) Error() string {
	return fmt.Sprintf("got %d lines for %d samples, want one line per sample", e.Lines, e.Samples)
}

// readRewards reads the answer to a batch of n samples from r: exactly n
// lines, each a JSON number or an object with a numeric "reward" field. It
// reads r to the end even after an error, so that a writer on the other side
// of a pipe is never blocked.
func readRewards(r io.Reader, n int) ([]float64, error) {
	defer io.Copy(io.Discard, r)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLineBytes)
	rewards := make([]float64, 0, n)
	lines := 0
	for sc.Scan() {
		lines++
		if lines > n {
			continue // counted for the error below
		}
		v, err := parseReward(sc.Bytes())
		if err != nil {
			return nil, &LineError{Line: lines, Msg: err.Error()}
		}
		rewards = append(rewards, v)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &LineError{Line: lines + 1, Msg: fmt.Sprintf("longer than %d bytes", maxLineBytes)}
		}
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	if lines != n {
		return nil, &CountError{Lines: lines, Samples: n}
	}
	return rewards, nil
}

// parseReward parses one line of an answer.
func parseReward(line []byte) (float64, error) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return 0, errors.New("empty line, want a number or {\"reward\": number}")
	}
	raw := json.RawMessage(line)
	if line[0] == '{' {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(line, &obj); err != nil {
			return 0, fmt.Errorf("invalid JSON %s: %v", quoteStart(line), err)
		}
		r, ok := obj["reward"]
		if !ok {
			return 0, fmt.Errorf("object %s has no \"reward\" field", quoteStart(line))
		}
		raw = bytes.TrimSpace(r)
	}
	if len(raw) == 0 || !(raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9') || !json.Valid(raw) {
		return 0, fmt.Errorf("reward %s is not a number", quoteStart(raw))
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("reward %s is not a number", quoteStart(raw))
	}
	if err := checkFinite(v); err != nil {
		return 0, fmt.Errorf("reward %s: %v", quoteStart(raw), err)
	}
	return v, nil
}

// quoteStart quotes the start of b for an error message.
func quoteStart(b []byte) string {
	const limit = 80
	if len(b) <= limit {
		return strconv.Quote(string(b))
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(b[cut]) {
		cut--
	}
	return strconv.Quote(string(b[:cut])) + "..."
}

// tailBuffer is an io.Writer that keeps the last max bytes written to it.
type tailBuffer struct {
	max   int
	buf   []byte
	total int64
}

// Write implements io.Writer.
func (t *tailBuffer) Write(p []byte) (int, error) {
	t.total += int64(len(p))
	if len(p) >= t.max {
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		return len(p), nil
	}
	if over := len(t.buf) + len(p) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return len(p), nil
}

// String returns the kept bytes, marked as cut when earlier ones were
// dropped, with invalid UTF-8 at the cut removed.
func (t *tailBuffer) String() string {
	s := string(bytes.TrimSpace(t.buf))
	if t.total > int64(len(t.buf)) {
		s = "..." + string(bytes.ToValidUTF8([]byte(s), nil))
	}
	return s
}
