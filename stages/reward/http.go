package reward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// bodyStart is how much of a response body errors quote.
const bodyStart = 512

// StatusError is a non-2xx answer of a reward URL.
type StatusError struct {
	StatusCode int
	Status     string // as the server sent it, e.g. "503 Service Unavailable"
	Body       string // the start of the body
}

// Error implements error.
func (e *StatusError) Error() string {
	msg := "HTTP " + e.Status
	if e.Body != "" {
		msg += ": " + e.Body
	}
	return msg
}

// Temporary reports whether the request may succeed if repeated: 5xx and 429.
func (e *StatusError) Temporary() bool {
	return e.StatusCode >= 500 || e.StatusCode == http.StatusTooManyRequests
}

// httpScorer scores a batch by POSTing its JSONL to a URL.
//
// The request body is the JSONL a command receives on stdin, with
// Content-Type application/x-ndjson; a 2xx answer's body must be what a
// command prints on stdout: one line per sample, in order. Each request is
// bounded by timeout. Network errors (a timeout included), 5xx and 429 are
// retried up to retries times, after backoff, 2*backoff, 4*backoff, ...
// capped at maxBackoff, or after the Retry-After the server asked for when
// that is longer (capped at maxRetryAfter). Other statuses and malformed
// answers fail at once. The context cancels the requests and the waits.
type httpScorer struct {
	url           string
	timeout       time.Duration
	retries       int
	client        *http.Client
	backoff       time.Duration
	maxBackoff    time.Duration
	maxRetryAfter time.Duration
}

// newHTTPScorer returns the scorer of the endpoint u.
func newHTTPScorer(u string, timeout time.Duration, retries int) *httpScorer {
	return &httpScorer{
		url:           u,
		timeout:       timeout,
		retries:       retries,
		client:        &http.Client{},
		backoff:       500 * time.Millisecond,
		maxBackoff:    10 * time.Second,
		maxRetryAfter: 60 * time.Second,
	}
}

// retryable marks an attempt's error as worth another try, after at least
// after (0: the backoff alone).
type retryable struct {
	err   error
	after time.Duration
}

func (r *retryable) Error() string { return r.err.Error() }
func (r *retryable) Unwrap() error { return r.err }

// Score implements Scorer.
func (h *httpScorer) Score(ctx context.Context, samples []Sample) ([]float64, error) {
	if len(samples) == 0 {
		return []float64{}, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("reward url %q: %w", h.url, err)
	}
	payload, err := encodeBatch(samples)
	if err != nil {
		return nil, fmt.Errorf("reward url %q: %w", h.url, err)
	}
	for attempt := 0; ; attempt++ {
		rewards, err := h.attempt(ctx, payload, len(samples))
		if err == nil {
			return rewards, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("reward url %q: %w (last error: %v)", h.url, ctx.Err(), err)
		}
		var re *retryable
		if !errors.As(err, &re) {
			return nil, fmt.Errorf("reward url %q: %w", h.url, err)
		}
		if attempt >= h.retries {
			if attempt == 0 {
				return nil, fmt.Errorf("reward url %q: %w", h.url, re.err)
			}
			return nil, fmt.Errorf("reward url %q: giving up after %d attempts: %w", h.url, attempt+1, re.err)
		}
		delay := h.delay(attempt, re.after)
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("reward url %q: %w (last error: %v)", h.url, ctx.Err(), re.err)
		case <-timer.C:
		}
	}
}

// delay returns the wait before retry number attempt+1: the exponential
// backoff, or the server's Retry-After when that is longer.
func (h *httpScorer) delay(attempt int, retryAfter time.Duration) time.Duration {
	d := h.backoff
	for i := 0; i < attempt && d < h.maxBackoff; i++ {
		d *= 2
	}
	d = min(d, h.maxBackoff)
	if retryAfter > d {
		d = min(retryAfter, h.maxRetryAfter)
	}
	return d
}

// attempt makes one request. Errors worth another try are *retryable.
func (h *httpScorer) attempt(ctx context.Context, payload []byte, n int) ([]float64, error) {
	reqCtx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	timedOut := func() bool { return ctx.Err() == nil && errors.Is(reqCtx.Err(), context.DeadlineExceeded) }
	timeoutErr := func() error {
		return &retryable{err: fmt.Errorf("timed out after %v: %w", h.timeout, context.DeadlineExceeded)}
	}

	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, h.url, bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := h.client.Do(req)
	if err != nil {
		if timedOut() {
			return nil, timeoutErr()
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is named by the caller
		}
		return nil, &retryable{err: err}
	}
	defer resp.Body.Close()

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		head, _ := io.ReadAll(io.LimitReader(resp.Body, bodyStart+1))
		se := &StatusError{StatusCode: resp.StatusCode, Status: resp.Status, Body: startOf(head)}
		if se.Temporary() {
			return nil, &retryable{err: se, after: parseRetryAfter(resp.Header.Get("Retry-After"))}
		}
		return nil, se
	}

	head := &headBuffer{max: bodyStart + 1}
	rewards, err := readRewards(io.TeeReader(resp.Body, head), n)
	if err != nil {
		if timedOut() {
			return nil, timeoutErr()
		}
		var le *LineError
		var ce *CountError
		if errors.As(err, &le) || errors.As(err, &ce) {
			return nil, fmt.Errorf("HTTP %s: body %w (body starts %q)", resp.Status, err, startOf(head.buf))
		}
		return nil, &retryable{err: fmt.Errorf("HTTP %s: %w", resp.Status, err)} // the connection broke mid-body
	}
	return rewards, nil
}

// startOf returns the start of a body for an error message.
func startOf(b []byte) string {
	s := strings.TrimSpace(string(bytes.ToValidUTF8(b, nil)))
	if len(b) > bodyStart {
		s = strings.TrimSpace(string(bytes.ToValidUTF8(b[:bodyStart], nil))) + "..."
	}
	return s
}

// parseRetryAfter parses a Retry-After header: seconds or an HTTP date.
// It returns 0 when there is none or it cannot be read.
func parseRetryAfter(v string) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(min(s, 3600)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// headBuffer is an io.Writer that keeps the first max bytes written to it.
type headBuffer struct {
	max int
	buf []byte
}

// Write implements io.Writer.
func (h *headBuffer) Write(p []byte) (int, error) {
	if room := h.max - len(h.buf); room > 0 {
		h.buf = append(h.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}
