package engines_test

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rlpipe/rlpipe/stages/engines"
	"github.com/rlpipe/rlpipe/stages/engines/enginetest"
)

// engine describes one engine kind for tests that run against both.
type engine struct {
	kind      string
	start     func(enginetest.Sampler) *enginetest.Server
	newClient func(string, engines.Options) (engines.Client, error)
	genPath   string // the generation endpoint
	perSample bool   // one generation request per sample (SGLang)
}

var bothEngines = []engine{
	{engines.KindSGLang, enginetest.NewSGLang, engines.NewSGLang, "/generate", true},
	{engines.KindOpenAI, enginetest.NewOpenAI, engines.NewOpenAI, "/v1/completions", false},
}

// serve starts e's test server, closed when the test ends.
func serve(t *testing.T, e engine) *enginetest.Server {
	t.Helper()
	srv := e.start(nil)
	t.Cleanup(srv.Close)
	return srv
}

// dial returns a client of e at url with fast backoff (1 ms doubling up to
// 4 ms), whose idle connections are closed when the test ends.
func dial(t *testing.T, e engine, url string, o engines.Options) engines.Client {
	t.Helper()
	c, err := e.newClient(url, o)
	if err != nil {
		t.Fatalf("new %s client: %v", e.kind, err)
	}
	engines.SetBackoff(c, time.Millisecond, 4*time.Millisecond)
	t.Cleanup(engines.HTTPClient(c).CloseIdleConnections)
	return c
}

// noLeaks fails the test if, once its other cleanups have run, more
// goroutines are left than when it started. Call it first.
func noLeaks(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(3 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<16)
			t.Errorf("%d goroutines left, %d before the test:\n%s", n, before, buf[:runtime.Stack(buf, true)])
		}
	})
}

// canonical returns JSON with its keys sorted, to compare bodies.
func canonical(t *testing.T, b []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("body %q is not JSON: %v", b, err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// wantError checks that err is not nil and contains every part.
func wantError(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not contain %q", err, p)
		}
	}
}

// waitFor polls cond for up to 3 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// within runs f and fails the test at once if it has not returned within
// d, so that a call that hangs fails the test instead of stalling it.
func within[T any](t *testing.T, d time.Duration, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(d):
		t.Fatalf("the call has not returned after %v", d)
		panic("unreachable")
	}
}

// controlCase is a test of a control call (reload, release, resume,
// health) against a test server prepared by setup.
type controlCase struct {
	name    string
	setup   func(*enginetest.Server)
	call    func(engines.Client, context.Context) error
	wantErr []string
	check   func(*testing.T, *enginetest.Server)
}

// runControl runs each case on a fresh server of e.
func runControl(t *testing.T, e engine, tests []controlCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := serve(t, e)
			if tt.setup != nil {
				tt.setup(srv)
			}
			c := dial(t, e, srv.URL, engines.Options{})
			err := tt.call(c, context.Background())
			if tt.wantErr != nil {
				wantError(t, err, tt.wantErr...)
			} else if err != nil {
				t.Fatal(err)
			}
			if tt.check != nil {
				tt.check(t, srv)
			}
		})
	}
}
