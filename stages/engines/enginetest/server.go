// Package enginetest has test servers that speak the HTTP protocols of the
// engines package's clients: SGLang's native API and vLLM's
// OpenAI-compatible API, in the shapes the real servers use. A Server
// records the requests it saw and can be told to fail them.
package enginetest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"github.com/rlpipe/rlpipe/stages/engines"
)

// Request is a request a Server saw.
type Request struct {
	Method string
	Path   string // without the query
	Query  string
	Body   []byte
}

// fault is what a server does instead of answering normally.
type fault struct {
	kind   faultKind
	status int
	body   string
	times  int // requests left; negative: every request
}

type faultKind int

const (
	faultRespond faultKind = iota // answer status and body
	faultHang                     // answer nothing until the request ends
	faultDrop                     // close the connection without an answer
	faultPass                     // answer normally
)

// Server is a test engine. Its methods are safe for concurrent use.
type Server struct {
	*httptest.Server

	sampler Sampler
	routes  map[string]route
	done    chan struct{} // closed by Close: hanging handlers return
	closed  sync.Once

	mu        sync.Mutex
	requests  []Request
	inFlight  map[string]int
	maxFlight map[string]int
	faults    map[string][]*fault
	delays    map[string]time.Duration
	abort     int // generation answers left to abort
	modelPath string
	reloads   int
	releases  int
	resumes   int
	released  bool
	prefixes  int  // /reset_prefix_cache calls
	noIDs     bool // OpenAI: answer without token_ids (vLLM < 0.10.2)
	noDevMode bool // OpenAI: 404 on the development endpoints
	model     string
}

// route is an endpoint: its method and handler, which gets the body read.
type route struct {
	method string
	handle func(w http.ResponseWriter, r *http.Request, body []byte)
}

// newServer starts a server with routes filled in by fill.
func newServer(s Sampler, fill func(*Server)) *Server {
	if s == nil {
		s = Counting
	}
	srv := &Server{
		sampler:   s,
		done:      make(chan struct{}),
		inFlight:  map[string]int{},
		maxFlight: map[string]int{},
		faults:    map[string][]*fault{},
		delays:    map[string]time.Duration{},
	}
	fill(srv)
	srv.Server = httptest.NewServer(http.HandlerFunc(srv.serve))
	return srv
}

// Close ends hanging requests and shuts the server down.
func (s *Server) Close() {
	s.closed.Do(func() { close(s.done) })
	s.Server.Close()
}

// serve records a request, applies the faults and delays of its path and
// routes it.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		return
	}
	path := r.URL.Path
	s.mu.Lock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: path, Query: r.URL.RawQuery, Body: body})
	s.inFlight[path]++
	s.maxFlight[path] = max(s.maxFlight[path], s.inFlight[path])
	f := s.takeFault(path)
	delay := s.delays[path]
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight[path]--
		s.mu.Unlock()
	}()

	if f != nil {
		switch f.kind {
		case faultRespond:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(f.status)
			io.WriteString(w, f.body)
			return
		case faultHang:
			s.wait(r, -1)
			return
		case faultDrop:
			if hj, ok := w.(http.Hijacker); ok {
				if conn, _, err := hj.Hijack(); err == nil {
					conn.Close()
					return
				}
			}
			panic(http.ErrAbortHandler)
		}
	}
	if delay > 0 && !s.wait(r, delay) {
		return
	}
	rt, ok := s.routes[path]
	switch {
	case !ok:
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	case r.Method != rt.method:
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
	default:
		rt.handle(w, r, body)
	}
}

// wait waits d (negative: for ever) or until the request or the server
// ends; it reports whether d passed.
func (s *Server) wait(r *http.Request, d time.Duration) bool {
	var timeout <-chan time.Time
	if d >= 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-timeout:
		return true
	case <-r.Context().Done():
	case <-s.done:
	}
	return false
}

// takeFault returns the fault for the next request on path, if any; s.mu
// is held.
func (s *Server) takeFault(path string) *fault {
	q := s.faults[path]
	for len(q) > 0 && q[0].times == 0 {
		q = q[1:]
	}
	s.faults[path] = q
	if len(q) == 0 {
		return nil
	}
	f := *q[0]
	if q[0].times > 0 {
		q[0].times--
	}
	if f.kind == faultPass {
		return nil
	}
	return &f
}

// addFault queues a fault on path.
func (s *Server) addFault(path string, f *fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[path] = append(s.faults[path], f)
}

// The faults of a path apply in the order they were added, each to the
// path's next times requests (a negative times: every request, for ever).

// FailNext answers the next times requests on path with status and the
// body {"error": {"message": "injected failure", ...}}.
func (s *Server) FailNext(path string, status, times int) {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": "injected failure", "type": http.StatusText(status), "code": status}})
	s.RespondNext(path, status, string(b), times)
}

// RespondNext answers the next times requests on path with status and
// body (sent as application/json whatever it is).
func (s *Server) RespondNext(path string, status int, body string, times int) {
	s.addFault(path, &fault{kind: faultRespond, status: status, body: body, times: times})
}

// Hang makes every later request on path wait, unanswered, until the
// client gives up on it or the server is closed.
func (s *Server) Hang(path string) { s.HangNext(path, -1) }

// HangNext makes the next times requests on path hang, as Hang.
func (s *Server) HangNext(path string, times int) {
	s.addFault(path, &fault{kind: faultHang, times: times})
}

// DropNext closes the connection of the next times requests on path
// without an answer: the client sees a network error.
func (s *Server) DropNext(path string, times int) {
	s.addFault(path, &fault{kind: faultDrop, times: times})
}

// PassNext answers the next times requests on path normally, before the
// faults queued after it apply.
func (s *Server) PassNext(path string, times int) {
	s.addFault(path, &fault{kind: faultPass, times: times})
}

// ClearFaults drops every queued fault.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.faults)
}

// SetDelay makes every request on path wait d before it is answered.
func (s *Server) SetDelay(path string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delays[path] = d
}

// AbortNext aborts the next times generation answers: SGLang's finish
// reason {"type": "abort", ...}, OpenAI's finish_reason "abort" (HTTP 200).
func (s *Server) AbortNext(times int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.abort = times
}

// takeAbort reports whether the next generation answer is aborted.
func (s *Server) takeAbort() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.abort == 0 {
		return false
	}
	if s.abort > 0 {
		s.abort--
	}
	return true
}

// Requests returns the requests seen on path, in order; "" returns every
// request.
func (s *Server) Requests(path string) []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Request
	for _, r := range s.requests {
		if path == "" || r.Path == path {
			r.Body = bytes.Clone(r.Body)
			out = append(out, r)
		}
	}
	return out
}

// Count returns the number of requests seen on path.
func (s *Server) Count(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.requests {
		if r.Path == path {
			n++
		}
	}
	return n
}

// Paths returns the path of every request seen, in order.
func (s *Server) Paths() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, len(s.requests))
	for i, r := range s.requests {
		out[i] = r.Path
	}
	return out
}

// InFlight returns the number of requests on path being answered now.
func (s *Server) InFlight(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight[path]
}

// MaxInFlight returns the most requests on path that were in flight at once.
func (s *Server) MaxInFlight(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxFlight[path]
}

// ModelPath returns the directory of the last successful reload.
func (s *Server) ModelPath() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.modelPath
}

// Reloads counts the successful reloads.
func (s *Server) Reloads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reloads
}

// Releases counts the successful memory releases.
func (s *Server) Releases() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.releases
}

// Resumes counts the successful memory resumptions.
func (s *Server) Resumes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resumes
}

// Released reports whether the memory is released now.
func (s *Server) Released() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.released
}

// record updates the server's state under its lock.
func (s *Server) record(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
}

// writeJSON answers status and v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding the answer"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

// writeError answers status and {"error": {"message": msg}}, as SGLang and
// vLLM do.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": http.StatusText(status), "code": status}})
}

// decodeStrict decodes body into v, refusing unknown fields.
func decodeStrict(body []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("data after the JSON value")
	}
	return nil
}

// sample calls the sampler and fills in what the sampler left out; it
// returns nil where the sampler returned other than n responses or
// mismatched log-probs.
func (s *Server) sample(prompt []int32, n int, p engines.Params) []engines.Response {
	rs := s.sampler(prompt, n, p)
	if len(rs) != n {
		return nil
	}
	out := make([]engines.Response, n)
	for j, r := range rs {
		if r.LogProbs == nil {
			r.LogProbs = make([]float32, len(r.Tokens))
			for k := range r.LogProbs {
				r.LogProbs[k] = -1
			}
		}
		if len(r.LogProbs) != len(r.Tokens) {
			return nil
		}
		if r.Finish == "" {
			r.Finish = engines.FinishStop
			if len(r.Tokens) >= p.MaxNewTokens {
				r.Finish = engines.FinishLength
			}
		}
		out[j] = r
	}
	return out
}
