package reward

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// reply is one scripted answer of a test server.
type reply struct {
	status     int
	body       string // "" answers the batch with fieldsReward, as objects
	retryAfter string
	hang       bool // wait for the client to give up
}

// scriptServer answers the i-th request with replies[i] (the last one
// repeats) and counts the requests.
func scriptServer(t *testing.T, replies ...reply) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := int(n.Add(1)) - 1
		rep := replies[min(i, len(replies)-1)]
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/x-ndjson" {
			http.Error(w, fmt.Sprintf("got %s with Content-Type %q", r.Method, r.Header.Get("Content-Type")), http.StatusTeapot)
			return
		}
		var lines []wireSample
		sc := bufio.NewScanner(r.Body)
		for sc.Scan() {
			var ws wireSample
			if err := json.Unmarshal(sc.Bytes(), &ws); err != nil {
				http.Error(w, "bad line: "+err.Error(), http.StatusTeapot)
				return
			}
			lines = append(lines, ws)
		}
		if rep.hang {
			select {
			case <-r.Context().Done():
			case <-time.After(20 * time.Second):
			}
			return
		}
		if rep.retryAfter != "" {
			w.Header().Set("Retry-After", rep.retryAfter)
		}
		w.WriteHeader(rep.status)
		if rep.body != "" {
			fmt.Fprint(w, rep.body)
			return
		}
		for _, ws := range lines {
			fmt.Fprintf(w, "{\"reward\": %v}\n", fieldsReward(ws))
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// newHTTP builds the scorer of u with New and fast backoff.
func newHTTP(t *testing.T, u string, timeoutS float64, retries int) *httpScorer {
	t.Helper()
	s, err := New(Config{URL: u, TimeoutS: timeoutS, Retries: retries})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h, ok := s.(*httpScorer)
	if !ok {
		t.Fatalf("New returned %T, want *httpScorer", s)
	}
	h.backoff = time.Millisecond
	return h
}

func TestHTTPScore(t *testing.T) {
	tests := []struct {
		name     string
		replies  []reply
		retries  int
		attempts int32
	}{
		{"success", []reply{{status: 200}}, 0, 1},
		{"500 then success", []reply{{status: 500, body: "overloaded"}, {status: 200}}, 2, 2},
		{"two 503 then success", []reply{{status: 503}, {status: 503}, {status: 200}}, 2, 3},
		{"429 then success", []reply{{status: 429, retryAfter: "0"}, {status: 200}}, 1, 2},
		{"timeout then success", []reply{{hang: true}, {status: 200}}, 1, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, n := scriptServer(t, tt.replies...)
			h := newHTTP(t, srv.URL, 0.5, tt.retries)
			samples := testSamples(5)
			got, err := h.Score(context.Background(), samples)
			if err != nil {
				t.Fatalf("Score: %v", err)
			}
			if want := wantFields(samples); !equalFloats(got, want) {
				t.Errorf("Score = %v, want %v", got, want)
			}
			if n.Load() != tt.attempts {
				t.Errorf("%d requests, want %d", n.Load(), tt.attempts)
			}
		})
	}
}

func TestHTTPErrors(t *testing.T) {
	long := strings.Repeat("z", 2000)
	tests := []struct {
		name     string
		replies  []reply
		retries  int
		attempts int32
		want     []string
		check    func(error) bool
	}{
		{
			name:     "400 is not retried",
			replies:  []reply{{status: 400, body: "bad request: no prompt_tokens"}, {status: 200}},
			retries:  3,
			attempts: 1,
			want:     []string{"HTTP 400 Bad Request: bad request: no prompt_tokens"},
			check:    func(err error) bool { var se *StatusError; return errors.As(err, &se) && se.StatusCode == 400 },
		},
		{
			name:     "500 until retries run out",
			replies:  []reply{{status: 500, body: "overloaded"}},
			retries:  2,
			attempts: 3,
			want:     []string{"giving up after 3 attempts", "HTTP 500 Internal Server Error: overloaded"},
			check:    func(err error) bool { var se *StatusError; return errors.As(err, &se) && se.StatusCode == 500 },
		},
		{
			name:     "500 without retries",
			replies:  []reply{{status: 500}, {status: 200}},
			retries:  0,
			attempts: 1,
			want:     []string{"HTTP 500"},
			check:    func(err error) bool { return !strings.Contains(err.Error(), "giving up") },
		},
		{
			name:     "the start of a long body",
			replies:  []reply{{status: 404, body: long}},
			attempts: 1,
			want:     []string{"HTTP 404 Not Found: zzz"},
			check: func(err error) bool {
				var se *StatusError
				return errors.As(err, &se) && se.Body == long[:bodyStart]+"..."
			},
		},
		{
			name:     "bad body is not retried",
			replies:  []reply{{status: 200, body: "<html>oops</html>\n"}},
			retries:  3,
			attempts: 1,
			want:     []string{"HTTP 200 OK: body line 1:", `"<html>oops</html>" is not a number`, `body starts "<html>oops</html>"`},
			check:    func(err error) bool { var le *LineError; return errors.As(err, &le) && le.Line == 1 },
		},
		{
			name:     "wrong line count",
			replies:  []reply{{status: 200, body: "1\n2\n"}},
			attempts: 1,
			want:     []string{"got 2 lines for 5 samples"},
			check:    func(err error) bool { var ce *CountError; return errors.As(err, &ce) && ce.Lines == 2 },
		},
		{
			name:     "non-numeric reward field",
			replies:  []reply{{status: 200, body: "1\n2\n{\"reward\": null}\n4\n5\n"}},
			attempts: 1,
			want:     []string{"body line 3:", `"null" is not a number`},
			check:    func(err error) bool { var le *LineError; return errors.As(err, &le) && le.Line == 3 },
		},
		{
			name:     "timeout",
			replies:  []reply{{hang: true}},
			attempts: 1,
			want:     []string{"timed out after 200ms"},
			check:    func(err error) bool { return errors.Is(err, context.DeadlineExceeded) },
		},
		{
			name:     "timeouts are retried",
			replies:  []reply{{hang: true}},
			retries:  1,
			attempts: 2,
			want:     []string{"giving up after 2 attempts", "timed out"},
			check:    func(err error) bool { return errors.Is(err, context.DeadlineExceeded) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, n := scriptServer(t, tt.replies...)
			h := newHTTP(t, srv.URL, 0.2, tt.retries)
			_, err := h.Score(context.Background(), testSamples(5))
			if err == nil {
				t.Fatal("Score succeeded, want an error")
			}
			for _, w := range append(tt.want, fmt.Sprintf("reward url %q", srv.URL)) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if !tt.check(err) {
				t.Errorf("error %q (%T) is not the error wanted", err, err)
			}
			if n.Load() != tt.attempts {
				t.Errorf("%d requests, want %d", n.Load(), tt.attempts)
			}
		})
	}
}

func TestHTTPNetworkErrorRetried(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	u := srv.URL
	srv.Close() // nothing listens there any more
	h := newHTTP(t, u, 5, 2)
	_, err := h.Score(context.Background(), testSamples(2))
	if err == nil || !strings.Contains(err.Error(), "giving up after 3 attempts") {
		t.Fatalf("error %v, want one giving up after 3 attempts", err)
	}
}

func TestHTTPCancelDuringBackoff(t *testing.T) {
	srv, n := scriptServer(t, reply{status: 503})
	h := newHTTP(t, srv.URL, 5, 5)
	h.backoff = time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	_, err := h.Score(ctx, testSamples(2))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("Score took %v after the cancel", elapsed)
	}
	if n.Load() != 1 {
		t.Errorf("%d requests, want 1", n.Load())
	}
}

func TestHTTPEmptyBatch(t *testing.T) {
	srv, n := scriptServer(t, reply{status: 500})
	h := newHTTP(t, srv.URL, 5, 0)
	got, err := h.Score(context.Background(), nil)
	if err != nil || len(got) != 0 {
		t.Fatalf("Score = %v, %v; want no rewards and no error", got, err)
	}
	if n.Load() != 0 {
		t.Errorf("%d requests, want none", n.Load())
	}
}

func TestHTTPDelay(t *testing.T) {
	h := newHTTPScorer("http://x", time.Second, 10)
	tests := []struct {
		attempt    int
		retryAfter time.Duration
		want       time.Duration
	}{
		{0, 0, 500 * time.Millisecond},
		{1, 0, time.Second},
		{2, 0, 2 * time.Second},
		{4, 0, 8 * time.Second},
		{5, 0, 10 * time.Second},
		{40, 0, 10 * time.Second},
		{0, 3 * time.Second, 3 * time.Second},
		{3, time.Second, 4 * time.Second},
		{0, time.Hour, time.Minute},
	}
	for _, tt := range tests {
		if got := h.delay(tt.attempt, tt.retryAfter); got != tt.want {
			t.Errorf("delay(%d, %v) = %v, want %v", tt.attempt, tt.retryAfter, got, tt.want)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"7", 7 * time.Second},
		{" 2 ", 2 * time.Second},
		{"-3", 0},
		{"soon", 0},
		{"99999", time.Hour},
		{"Mon, 02 Jan 2006 15:04:05 GMT", 0}, // in the past
	}
	for _, tt := range tests {
		if got := parseRetryAfter(tt.in); got != tt.want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
