package rollout

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// Prompt is one line of a prompts file: what a generate stage samples
// responses to.
type Prompt struct {
	// Tokens are the prompt's token ids (at least one).
	Tokens []int32
	// Labels holds every other field of the line (an answer to check, a
	// test to run), decoded by encoding/json, for the reward.
	Labels map[string]any
	// Index is the prompt's 0-based position in the file (blank lines are
	// not counted); Line its 1-based line.
	Index, Line int
}

// ReadPrompts reads a prompts file; see DecodePrompts.
func ReadPrompts(path string) ([]Prompt, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return DecodePrompts(path, f)
}

// DecodePrompts reads prompts from r, one JSON object per line:
// "prompt_tokens" (required, a non-empty array of token ids in
// [0, 2147483647]) and any other fields, kept as labels. Blank lines are
// skipped, a UTF-8 byte order mark before the first line is ignored. Every
// problem is returned as an ErrorList of "name:line: message" entries,
// with the prompts of the lines that decoded. A file with no prompts is an
// error.
func DecodePrompts(name string, r io.Reader) ([]Prompt, error) {
	var (
		prompts []Prompt
		errs    ErrorList
	)
	err := eachLine(name, r, func(lineNo int, b []byte) {
		p, msg := parsePrompt(b)
		if msg != "" {
			errs = append(errs, &LineError{Name: name, Line: lineNo, Msg: msg})
			return
		}
		p.Index, p.Line = len(prompts), lineNo
		prompts = append(prompts, p)
	})
	if err != nil {
		return nil, err
	}
	if len(errs) > 0 {
		return prompts, errs
	}
	if len(prompts) == 0 {
		return nil, &LineError{Name: name, Msg: "no prompts"}
	}
	return prompts, nil
}

// parsePrompt decodes one line, or says what is wrong with it.
func parsePrompt(b []byte) (Prompt, string) {
	fields, msgs := splitObject(b)
	if len(msgs) > 0 {
		return Prompt{}, msgs[0]
	}
	p := Prompt{Labels: map[string]any{}}
	found := false
	for _, f := range fields {
		if f.key == "prompt_tokens" {
			toks, msg := tokenArray(f.raw, "prompt_tokens")
			if msg != "" {
				return Prompt{}, msg
			}
			if len(toks) == 0 {
				return Prompt{}, "prompt_tokens is empty"
			}
			p.Tokens, found = toks, true
			continue
		}
		var v any
		if err := json.Unmarshal(f.raw, &v); err != nil {
			return Prompt{}, fmt.Sprintf("%s: %v", f.key, err)
		}
		p.Labels[f.key] = v
	}
	if !found {
		return Prompt{}, "missing prompt_tokens"
	}
	return p, ""
}
