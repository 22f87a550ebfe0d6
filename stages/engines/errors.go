package engines

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// bodyStart is how much of a response body an error quotes.
const bodyStart = 512

// Error is a request to an engine that failed for good.
type Error struct {
	// Engine is KindSGLang or KindOpenAI.
	Engine string
	// Op is the client operation: "generate", "reload_from_disk",
	// "release_memory", "resume_memory" or "health".
	Op string
	// Method and URL are those of the request that failed.
	Method string
	URL    string
	// Prompt and Sample index the generation request that failed; -1
	// where there is none (OpenAI requests carry every sample of a
	// prompt, control requests no prompt).
	Prompt int
	Sample int
	// StatusCode and Status are the HTTP answer's ("400 Bad Request");
	// 0 and "" when none came (network errors, timeouts, cancellation).
	StatusCode int
	Status     string
	// Message is the engine's own error message, where its body has one.
	Message string
	// Body is the start of the answer's body (at most 512 bytes).
	Body string
	// Attempts is the number of attempts made.
	Attempts int
	// Hint explains a likely cause, such as a server option to set.
	Hint string
	// Err is the underlying error, if any: a network error, a timeout
	// (context.DeadlineExceeded), the caller's context's error, a decoding
	// error.
	Err error
}

// Error implements error.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Engine)
	b.WriteByte(' ')
	b.WriteString(e.Op)
	if e.Prompt >= 0 {
		fmt.Fprintf(&b, " prompt %d", e.Prompt)
	}
	if e.Sample >= 0 {
		fmt.Fprintf(&b, " sample %d", e.Sample)
	}
	fmt.Fprintf(&b, ": %s %s", e.Method, e.URL)
	if e.StatusCode != 0 {
		status := e.Status
		if status == "" {
			status = strconv.Itoa(e.StatusCode)
		}
		fmt.Fprintf(&b, ": HTTP %s", status)
	}
	if e.Message != "" {
		fmt.Fprintf(&b, ": %q", e.Message)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	if e.Hint != "" {
		b.WriteString(" (")
		b.WriteString(e.Hint)
		b.WriteString(")")
	}
	if e.Body != "" {
		fmt.Fprintf(&b, "; body: %s", e.Body)
	}
	if e.Attempts > 1 {
		fmt.Fprintf(&b, "; after %d attempts", e.Attempts)
	}
	return b.String()
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// startOf returns the start of a body for an error message: valid UTF-8,
// trimmed, at most bodyStart bytes and "..." where it was cut.
func startOf(body []byte) string {
	cut := len(body) > bodyStart
	if cut {
		body = body[:bodyStart]
		// Drop a rune cut in half rather than quote a replacement for it.
		for i := 0; i < utf8.UTFMax-1 && len(body) > 0; i++ {
			if r, size := utf8.DecodeLastRune(body); r != utf8.RuneError || size != 1 {
				break
			}
			body = body[:len(body)-1]
		}
	}
	s := strings.TrimSpace(string(bytes.ToValidUTF8(body, []byte("\uFFFD"))))
	if cut {
		s += "..."
	}
	return s
}

// engineMessage returns the error message an engine put in a JSON body:
// {"error": {"message": ...}} (SGLang, recent vLLM), {"error": "..."},
// {"message": ...} (older vLLM, SGLang's success:false answers) or
// {"detail": ...} (FastAPI). It returns "" where there is none.
func engineMessage(body []byte) string {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return ""
	}
	var s string
	if raw, ok := top["error"]; ok {
		if json.Unmarshal(raw, &s) == nil && s != "" {
			return bounded(s)
		}
		var nested struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(raw, &nested) == nil && nested.Message != "" {
			return bounded(nested.Message)
		}
	}
	if raw, ok := top["message"]; ok && json.Unmarshal(raw, &s) == nil && s != "" {
		return bounded(s)
	}
	if raw, ok := top["detail"]; ok {
		if json.Unmarshal(raw, &s) == nil && s != "" {
			return bounded(s)
		}
		if len(raw) > 0 && string(raw) != "null" {
			return bounded(string(raw))
		}
	}
	return ""
}

// bounded cuts a message to bodyStart bytes.
func bounded(s string) string {
	if len(s) <= bodyStart {
		return s
	}
	return startOf([]byte(s))
}
