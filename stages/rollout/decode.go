package rollout

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// slimeInfoFields are fields of slime's Sample.to_dict() that carry no
// training data for rlpipe. They are accepted, whatever their value, only on
// slime-dialect lines (lines with "tokens"), and are not kept.
var slimeInfoFields = map[string]bool{
	"index":                  true,
	"prompt":                 true,
	"response":               true,
	"label":                  true,
	"status":                 true,
	"metadata":               true,
	"weight_versions":        true,
	"spec_info":              true,
	"prefix_cache_info":      true,
	"generate_function_path": true,
	"train_metadata":         true,
	"session_id":             true,
	"non_generation_time":    true,
	"multimodal_inputs":      true,
}

// slimeUnsupportedFields are slime fields that would change training but
// that rlpipe does not implement: null is accepted, any other value is an
// error.
var slimeUnsupportedFields = map[string]bool{
	"multimodal_train_inputs": true,
	"rollout_routed_experts":  true,
	"teacher_log_probs":       true,
	"mopd_teacher_log_probs":  true,
}

// Read reads a rollout JSONL file; see Decode.
func Read(path string) ([]Sample, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Decode(path, f)
}

// Decode reads rollout samples from r, one JSON object per line, in either
// dialect described in docs/data.md. Blank lines are skipped; lines may be of
// any length. Decoding is strict: unknown fields, wrong types, out-of-range
// values and inconsistent lengths are errors. Every problem is collected and
// returned as an ErrorList of "name:line: message" entries, together with
// the samples of the lines that decoded, so that a caller can check those
// too and report everything at once. A file with no samples is an error.
func Decode(name string, r io.Reader) ([]Sample, error) {
	var (
		samples []Sample
		errs    ErrorList
	)
	err := eachLine(name, r, func(lineNo int, b []byte) {
		s, msgs := parseLine(b)
		for _, m := range msgs {
			errs = append(errs, &LineError{Name: name, Line: lineNo, Msg: m})
		}
		if len(msgs) == 0 {
			s.Line = lineNo
			s.Index = len(samples)
			samples = append(samples, s)
		}
	})
	if err != nil {
		return nil, err
	}
	// Rollout log-probs are all or nothing: the first sample decides.
	if len(samples) > 0 {
		first := samples[0]
		for _, s := range samples[1:] {
			switch {
			case first.RolloutLogProbs != nil && s.RolloutLogProbs == nil:
				errs = append(errs, &LineError{Name: name, Line: s.Line,
					Msg: fmt.Sprintf("rollout_log_probs missing, but line %d has them (give them on every line or on none)", first.Line)})
			case first.RolloutLogProbs == nil && s.RolloutLogProbs != nil:
				errs = append(errs, &LineError{Name: name, Line: s.Line,
					Msg: fmt.Sprintf("rollout_log_probs given, but line %d has none (give them on every line or on none)", first.Line)})
			}
		}
	}
	if len(errs) > 0 {
		return samples, errs
	}
	if len(samples) == 0 {
		return nil, &LineError{Name: name, Msg: "no samples"}
	}
	return samples, nil
}

// field is one top-level member of a line's JSON object.
type field struct {
	key string
	raw []byte
}

// splitObject parses one line as a JSON object and returns its members in
// order. It reports duplicate keys; a syntax error ends the line's parse.
func splitObject(b []byte) ([]field, []string) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, []string{syntaxMsg(b, err)}
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, []string{"line is not a JSON object"}
	}
	var (
		fields []field
		msgs   []string
		seen   = map[string]bool{}
	)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, append(msgs, syntaxMsg(b, err))
		}
		key, _ := tok.(string) // object keys are always strings
		off := dec.InputOffset()
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if m := nonFiniteMsg(key, b, off); m != "" {
				return nil, append(msgs, m)
			}
			return nil, append(msgs, syntaxMsg(b, err))
		}
		if seen[key] {
			msgs = append(msgs, fmt.Sprintf("duplicate field %q", key))
			continue
		}
		seen[key] = true
		fields = append(fields, field{key, raw})
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, append(msgs, syntaxMsg(b, err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, append(msgs, "unexpected data after the JSON object")
	}
	return fields, msgs
}

// syntaxMsg describes a JSON syntax error in line b. The decoder's offsets
// are not always relative to the line, so the line is checked again with
// json.Unmarshal, whose SyntaxError.Offset is the 1-based column of the
// offending byte.
func syntaxMsg(b []byte, err error) string {
	var se *json.SyntaxError
	if uerr := json.Unmarshal(b, new(json.RawMessage)); errors.As(uerr, &se) {
		if int(se.Offset) >= len(b) && strings.Contains(se.Error(), "unexpected end") {
			return "invalid JSON: unexpected end of line"
		}
		return fmt.Sprintf("invalid JSON at column %d: %v", se.Offset, se)
	}
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return "invalid JSON: unexpected end of line"
	}
	return "invalid JSON: " + err.Error()
}

// nonFiniteMsg recognises the NaN and Infinity literals that Python's json
// module writes but that are not JSON, in the value following offset off.
func nonFiniteMsg(key string, b []byte, off int64) string {
	i := int(off)
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == ':') {
		i++
	}
	for _, lit := range []string{"NaN", "Infinity", "-Infinity", "+Infinity"} {
		if bytes.HasPrefix(b[i:], []byte(lit)) {
			return fmt.Sprintf("%s: %s is not allowed (not a finite JSON number)", key, lit)
		}
	}
	return ""
}

// kind names the JSON type of a raw value for error messages.
func kind(raw []byte) string {
	if len(raw) == 0 {
		return "nothing"
	}
	return kindByte(raw[0])
}

func kindByte(c byte) string {
	switch c {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

func isNull(raw []byte) bool { return string(raw) == "null" }

// parseInt parses an integer literal. ok is false when the literal has a
// fraction or an exponent; huge is true when |v| exceeds 2^62 (v is then
// clamped).
func parseInt(lit []byte) (v int64, ok, huge bool) {
	neg := len(lit) > 0 && lit[0] == '-'
	digits := lit
	if neg {
		digits = lit[1:]
	}
	if len(digits) == 0 {
		return 0, false, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false, false
		}
		if v > (1<<62)/10 {
			huge = true
			continue
		}
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true, huge
}

// scanArray calls fn on the literal text of each element of the JSON array
// raw (valid JSON, as returned by the decoder). It stops at the first message
// fn returns, or at the first element that is not a number.
func scanArray(raw []byte, name string, fn func(i int, lit []byte) string) string {
	if len(raw) == 0 || raw[0] != '[' {
		return fmt.Sprintf("%s: want an array, got %s", name, kind(raw))
	}
	n := 0
	for i := 1; i < len(raw); {
		switch c := raw[i]; {
		case c == ']':
			return ""
		case c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '-' || (c >= '0' && c <= '9'):
			j := i
			for j < len(raw) && isNumByte(raw[j]) {
				j++
			}
			if m := fn(n, raw[i:j]); m != "" {
				return m
			}
			n++
			i = j
		default:
			return fmt.Sprintf("%s[%d]: want a number, got %s", name, n, kindByte(c))
		}
	}
	return ""
}

func isNumByte(c byte) bool {
	return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}

// tokenArray parses an array of token ids in [0, MaxTokenID].
func tokenArray(raw []byte, name string) ([]int32, string) {
	out := make([]int32, 0, len(raw)/4)
	m := scanArray(raw, name, func(i int, lit []byte) string {
		v, ok, huge := parseInt(lit)
		switch {
		case !ok:
			return fmt.Sprintf("%s[%d]: %s is not an integer token id", name, i, lit)
		case v < 0:
			return fmt.Sprintf("%s[%d]: %s is negative", name, i, lit)
		case huge || v > MaxTokenID:
			return fmt.Sprintf("%s[%d]: %s exceeds the largest token id %d", name, i, lit, MaxTokenID)
		}
		out = append(out, int32(v))
		return ""
	})
	if m != "" {
		return nil, m
	}
	return out, ""
}

// floatArray parses an array of numbers, each checked by valid, which returns
// a description of the allowed range when the value is outside it.
func floatArray(raw []byte, name string, valid func(float64) string) ([]float32, string) {
	out := make([]float32, 0, len(raw)/4)
	m := scanArray(raw, name, func(i int, lit []byte) string {
		v, err := strconv.ParseFloat(string(lit), 64)
		if err != nil || math.IsInf(v, 0) {
			return fmt.Sprintf("%s[%d]: %s is out of range", name, i, lit)
		}
		if why := valid(v); why != "" {
			return fmt.Sprintf("%s[%d]: %s %s", name, i, lit, why)
		}
		out = append(out, float32(v))
		return ""
	})
	if m != "" {
		return nil, m
	}
	return out, ""
}

// intValue parses a scalar integer field.
func intValue(raw []byte, name string) (int64, string) {
	if k := kind(raw); k != "a number" {
		return 0, fmt.Sprintf("%s: want an integer, got %s", name, k)
	}
	v, ok, huge := parseInt(raw)
	switch {
	case !ok:
		return 0, fmt.Sprintf("%s: %s is not an integer", name, raw)
	case huge:
		return 0, fmt.Sprintf("%s: %s is out of range", name, raw)
	}
	return v, ""
}

// floatValue parses a scalar finite number.
func floatValue(raw []byte, name string) (float64, string) {
	if k := kind(raw); k != "a number" {
		return 0, fmt.Sprintf("%s: want a number, got %s", name, k)
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || math.IsInf(v, 0) {
		return 0, fmt.Sprintf("%s: %s is out of range", name, raw)
	}
	return v, ""
}

func maskRange(v float64) string {
	if v < 0 || v > 1 {
		return "is outside [0, 1]"
	}
	return ""
}

func logProbRange(v float64) string {
	if v > 0 {
		return "is positive (log-probs are ≤ 0)"
	}
	return ""
}

// parseLine decodes one non-blank line into a sample, returning every problem
// found. Index and Line are left for the caller.
func parseLine(b []byte) (Sample, []string) {
	fields, msgs := splitObject(b)
	if fields == nil && len(msgs) > 0 {
		return Sample{}, msgs
	}
	var slime, ours bool
	for _, f := range fields {
		switch f.key {
		case "tokens":
			slime = true
		case "prompt_tokens", "response_tokens":
			ours = true
		}
	}
	switch {
	case slime && ours:
		return Sample{}, append(msgs, `"tokens" (slime dialect) cannot be combined with "prompt_tokens"/"response_tokens"`)
	case !slime && !ours:
		msgs = append(msgs, `missing tokens: give "prompt_tokens" and "response_tokens", or slime's "tokens" and "response_length"`)
	}

	var (
		s                          Sample
		tokens, prompt, response   []int32
		tokensOK, promptOK, respOK bool
		respLen                    int64
		haveRespLen, respLenOK     bool
		haveReward                 bool
		groupKeys                  []string
		mask, logProbs             []float32
		haveMask, haveLogProbs     bool
		maskOK, logProbsOK         = true, true
	)
	for _, f := range fields {
		var m string
		switch f.key {
		case "tokens":
			tokens, m = tokenArray(f.raw, f.key)
			tokensOK = m == ""
		case "prompt_tokens":
			prompt, m = tokenArray(f.raw, f.key)
			promptOK = m == ""
		case "response_tokens":
			response, m = tokenArray(f.raw, f.key)
			respOK = m == ""
		case "response_length":
			if !slime {
				m = `field "response_length" belongs to the slime dialect (with "tokens"); with "response_tokens" it is implied`
				break
			}
			haveRespLen = true
			respLen, m = intValue(f.raw, f.key)
			respLenOK = m == ""
		case "reward":
			haveReward = true
			s.Reward, m = floatValue(f.raw, f.key)
		case "group", "group_index", "prompt_id":
			groupKeys = append(groupKeys, f.key)
			var g int64
			g, m = intValue(f.raw, f.key)
			if m == "" && (g < 0 || g > math.MaxInt32) {
				m = fmt.Sprintf("%s: %d is outside [0, %d]", f.key, g, math.MaxInt32)
			}
			s.Group = int(g)
		case "loss_mask":
			if !isNull(f.raw) {
				haveMask = true
				mask, m = floatArray(f.raw, f.key, maskRange)
				maskOK = m == ""
			}
		case "rollout_log_probs":
			if !isNull(f.raw) {
				haveLogProbs = true
				logProbs, m = floatArray(f.raw, f.key, logProbRange)
				logProbsOK = m == ""
			}
		case "remove_sample":
			switch {
			case !slime:
				m = fmt.Sprintf("unknown field %q", f.key)
			case string(f.raw) == "true":
				m = "remove_sample is true: filter removed samples out before writing the file"
			case string(f.raw) != "false" && !isNull(f.raw):
				m = fmt.Sprintf("remove_sample: want a boolean, got %s", kind(f.raw))
			}
		default:
			switch {
			case slime && slimeInfoFields[f.key]:
				// Informational slime field: accepted and not kept.
			case slime && slimeUnsupportedFields[f.key]:
				if !isNull(f.raw) {
					m = fmt.Sprintf("field %q is not supported by rlpipe (only null is accepted)", f.key)
				}
			case !slime && (slimeInfoFields[f.key] || slimeUnsupportedFields[f.key]):
				m = fmt.Sprintf("unknown field %q (slime's informational fields are accepted only on lines with \"tokens\")", f.key)
			default:
				m = fmt.Sprintf("unknown field %q", f.key)
			}
		}
		if m != "" {
			msgs = append(msgs, m)
		}
	}

	// Required fields.
	if !haveReward {
		msgs = append(msgs, "missing reward")
	}
	switch len(groupKeys) {
	case 0:
		msgs = append(msgs, `missing group id: give "group", "group_index" or "prompt_id"`)
	case 1:
	default:
		msgs = append(msgs, fmt.Sprintf("several group ids (%q and %q): give only one", groupKeys[0], groupKeys[1]))
	}

	// Tokens and response length.
	lengthsOK := false
	switch {
	case slime:
		if !haveRespLen {
			msgs = append(msgs, "missing response_length")
		}
		if tokensOK && len(tokens) == 0 {
			msgs = append(msgs, "tokens is empty")
		} else if tokensOK && haveRespLen && respLenOK {
			switch {
			case respLen <= 0:
				msgs = append(msgs, fmt.Sprintf("response_length must be positive, got %d", respLen))
			case respLen >= int64(len(tokens)):
				msgs = append(msgs, fmt.Sprintf("response_length %d must be less than the %d tokens (at least one prompt token is needed)", respLen, len(tokens)))
			default:
				s.Tokens = tokens
				s.ResponseLength = int(respLen)
				lengthsOK = true
			}
		}
	case ours:
		have := map[string]bool{}
		for _, f := range fields {
			have[f.key] = true
		}
		for _, k := range []string{"prompt_tokens", "response_tokens"} {
			if !have[k] {
				msgs = append(msgs, "missing "+k)
			}
		}
		if promptOK && len(prompt) == 0 {
			msgs = append(msgs, "prompt_tokens is empty (at least one prompt token is needed)")
		}
		if respOK && len(response) == 0 {
			msgs = append(msgs, "response_tokens is empty")
		}
		if promptOK && respOK && len(prompt) > 0 && len(response) > 0 {
			s.Tokens = append(prompt[:len(prompt):len(prompt)], response...)
			s.ResponseLength = len(response)
			lengthsOK = true
		}
	}

	// Per-response-token arrays.
	if lengthsOK {
		r := s.ResponseLength
		if haveMask && maskOK && len(mask) != r {
			msgs = append(msgs, fmt.Sprintf("loss_mask has %d entries, want response_length %d", len(mask), r))
		}
		if haveLogProbs && logProbsOK && len(logProbs) != r {
			msgs = append(msgs, fmt.Sprintf("rollout_log_probs has %d entries, want response_length %d", len(logProbs), r))
		}
		if !haveMask {
			mask = make([]float32, r)
			for i := range mask {
				mask[i] = 1
			}
		}
		s.LossMask = mask
		if haveLogProbs {
			s.RolloutLogProbs = logProbs
		}
	}
	if len(msgs) > 0 {
		return Sample{}, msgs
	}
	return s, nil
}

// eachLine calls f with every non-blank line of r (trimmed) and its 1-based
// number. Lines may be of any length; a UTF-8 byte order mark before the
// first line, as some editors write, is not data. It returns a read error
// with the name and line.
func eachLine(name string, r io.Reader, f func(lineNo int, b []byte)) error {
	br := bufio.NewReaderSize(r, 1<<16)
	for lineNo := 1; ; lineNo++ {
		line, err := br.ReadBytes('\n')
		if lineNo == 1 {
			line = bytes.TrimPrefix(line, []byte("\xef\xbb\xbf"))
		}
		if b := bytes.TrimSpace(line); len(b) > 0 {
			f(lineNo, b)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s:%d: read: %w", name, lineNo, err)
		}
	}
}
