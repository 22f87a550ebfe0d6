package engines

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// maxBody bounds the bytes read from one answer.
const maxBody = 1 << 30

// requester sends one engine's requests with the bounds of its Options:
// the concurrency of generation requests, the timeout of each attempt and
// the retries with exponential backoff.
type requester struct {
	engine     string // KindSGLang or KindOpenAI
	base       string // scheme://host[:port][/path], no trailing slash
	client     *http.Client
	conc       int
	timeout    time.Duration
	retries    int
	backoff    time.Duration // the first wait
	maxBackoff time.Duration // the longest wait
	sem        chan struct{} // a slot per generation request in flight
}

// newRequester checks the base URL and the options and fills in the
// defaults.
func newRequester(engine, baseURL string, o Options) (*requester, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("%s: base URL %q: %w", engine, baseURL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%s: base URL %q: want http:// or https:// and a host, such as http://127.0.0.1:30000", engine, baseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("%s: base URL %q: want no query, fragment or user", engine, baseURL)
	}
	if o.Concurrency < 0 {
		return nil, fmt.Errorf("%s: concurrency must be at least 0 (0: %d), got %d", engine, DefaultConcurrency, o.Concurrency)
	}
	if o.Timeout < 0 {
		return nil, fmt.Errorf("%s: timeout must be at least 0 (0: %v), got %v", engine, DefaultTimeout, o.Timeout)
	}
	r := &requester{
		engine:     engine,
		base:       strings.TrimRight(u.String(), "/"),
		client:     o.Client,
		conc:       o.Concurrency,
		timeout:    o.Timeout,
		retries:    o.Retries,
		backoff:    backoffBase,
		maxBackoff: backoffMax,
	}
	if r.conc == 0 {
		r.conc = DefaultConcurrency
	}
	if r.timeout == 0 {
		r.timeout = DefaultTimeout
	}
	switch {
	case r.retries == 0:
		r.retries = DefaultRetries
	case r.retries < 0:
		r.retries = 0
	}
	if r.client == nil {
		r.client = defaultClient(r.conc)
	}
	r.sem = make(chan struct{}, r.conc)
	return r, nil
}

// defaultClient returns a client that keeps conns idle connections per
// host, so that a step's requests reuse them, and dials within 30 s. It
// sets no overall timeout: each attempt has its own.
func defaultClient(conns int) *http.Client {
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		MaxIdleConns:          conns + 16,
		MaxIdleConnsPerHost:   conns,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}}
}

// request is one logical request: its attempts share it.
type request struct {
	op     string // Error.Op
	method string
	path   string // from the base URL, with its query if any
	body   any    // marshalled as JSON; nil sends no body
	prompt int    // Error.Prompt
	sample int    // Error.Sample
	// generation requests count against the concurrency bound.
	generation bool
	// once makes one attempt whatever Options.Retries.
	once bool
	// hint explains a final status, or returns "".
	hint func(status int) string
}

// reply is a 2xx answer.
type reply struct {
	status   int
	text     string // "200 OK"
	body     []byte
	attempts int
}

// fail returns the *Error of a request whose 2xx answer rep is unusable.
func (r *requester) fail(q *request, rep *reply, message string, err error) *Error {
	e := r.newError(q)
	e.StatusCode, e.Status, e.Attempts = rep.status, rep.text, rep.attempts
	e.Message, e.Body, e.Err = message, startOf(rep.body), err
	return e
}

// newError returns the *Error of request q, its answer unknown.
func (r *requester) newError(q *request) *Error {
	return &Error{Engine: r.engine, Op: q.op, Method: q.method, URL: r.base + q.path, Prompt: q.prompt, Sample: q.sample}
}

// attemptError is a failed attempt.
type attemptError struct {
	e     *Error
	retry bool          // another attempt may succeed
	after time.Duration // the Retry-After the server asked for
}

// do sends q until an attempt answers 2xx, an attempt fails for good, the
// retries are spent or ctx ends. Failures are *Error.
func (r *requester) do(ctx context.Context, q *request) (*reply, error) {
	var payload []byte
	if q.body != nil {
		var err error
		if payload, err = json.Marshal(q.body); err != nil {
			e := r.newError(q)
			e.Err = fmt.Errorf("encoding the request: %w", err)
			return nil, e
		}
	}
	retries := r.retries
	if q.once {
		retries = 0
	}
	for attempt := 1; ; attempt++ {
		rep, ae := r.attempt(ctx, q, payload)
		if ae == nil {
			rep.attempts = attempt
			return rep, nil
		}
		ae.e.Attempts = attempt
		if !ae.retry || attempt > retries {
			return nil, ae.e
		}
		timer := time.NewTimer(r.delay(attempt, ae.after))
		select {
		case <-ctx.Done():
			timer.Stop()
			e := r.newError(q)
			e.Attempts = attempt
			e.Err = fmt.Errorf("%w while waiting to retry (last attempt: %v)", ctx.Err(), ae.e)
			return nil, e
		case <-timer.C:
		}
	}
}

// delay returns the wait after failed attempt number attempt (from 1): the
// exponential backoff, or the server's Retry-After where that is longer,
// capped at maxBackoff.
func (r *requester) delay(attempt int, after time.Duration) time.Duration {
	d := r.backoff
	for i := 1; i < attempt && d < r.maxBackoff; i++ {
		d *= 2
	}
	return min(max(d, after), r.maxBackoff)
}

// attempt makes one attempt at q.
func (r *requester) attempt(ctx context.Context, q *request, payload []byte) (*reply, *attemptError) {
	failed := func(retry bool, err error) *attemptError {
		e := r.newError(q)
		e.Err = err
		return &attemptError{e: e, retry: retry}
	}
	if q.generation {
		select {
		case r.sem <- struct{}{}:
			defer func() { <-r.sem }()
		case <-ctx.Done():
			return nil, failed(false, ctx.Err())
		}
	}
	actx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	// transportError classifies an error of sending or reading.
	transportError := func(err error) *attemptError {
		switch {
		case ctx.Err() != nil:
			return failed(false, ctx.Err())
		case errors.Is(actx.Err(), context.DeadlineExceeded):
			return failed(true, fmt.Errorf("no answer within the timeout of %v: %w", r.timeout, context.DeadlineExceeded))
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is named already
		}
		return failed(true, err)
	}

	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(actx, q.method, r.base+q.path, body)
	if err != nil {
		return nil, failed(false, err)
	}
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, transportError(err)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	resp.Body.Close()
	ok := resp.StatusCode >= 200 && resp.StatusCode <= 299
	if err != nil && ok {
		return nil, transportError(fmt.Errorf("reading the answer (HTTP %s): %w", resp.Status, err))
	}
	if len(data) > maxBody {
		ae := failed(false, fmt.Errorf("the answer is longer than %d bytes", maxBody))
		ae.e.StatusCode, ae.e.Status, ae.e.Body = resp.StatusCode, resp.Status, startOf(data)
		return nil, ae
	}
	if ok {
		return &reply{status: resp.StatusCode, text: resp.Status, body: data}, nil
	}
	e := r.newError(q)
	e.StatusCode, e.Status, e.Body, e.Message = resp.StatusCode, resp.Status, startOf(data), engineMessage(data)
	if q.hint != nil {
		e.Hint = q.hint(resp.StatusCode)
	}
	retry := resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500
	if retry && ctx.Err() != nil {
		retry = false
	}
	return nil, &attemptError{e: e, retry: retry, after: retryAfter(resp.Header.Get("Retry-After"))}
}

// retryAfter reads a Retry-After header in seconds or as an HTTP date; it
// returns 0 where there is none.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
		return time.Duration(max(s, 0)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}
