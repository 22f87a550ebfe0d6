package engines_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlpipe/rlpipe/stages/engines"
	"github.com/rlpipe/rlpipe/stages/engines/enginetest"
)

var params = engines.Params{MaxNewTokens: 3, Temperature: 1, TopP: 1}

func TestRetries(t *testing.T) {
	tests := []struct {
		name      string
		setup     func(s *enginetest.Server, path string)
		retries   int
		wantCalls int
		wantErr   []string
	}{
		{name: "500 twice then success", setup: func(s *enginetest.Server, p string) { s.FailNext(p, 500, 2) }, wantCalls: 3},
		{name: "429 then success", setup: func(s *enginetest.Server, p string) { s.FailNext(p, 429, 1) }, wantCalls: 2},
		{name: "503 three times then success", setup: func(s *enginetest.Server, p string) { s.FailNext(p, 503, 3) }, wantCalls: 4},
		{name: "network errors then success", setup: func(s *enginetest.Server, p string) { s.DropNext(p, 2) }, wantCalls: 3},
		{name: "502 past the retries", setup: func(s *enginetest.Server, p string) { s.FailNext(p, 502, 4) }, wantCalls: 4,
			wantErr: []string{"HTTP 502 Bad Gateway", "after 4 attempts"}},
		{name: "one retry", setup: func(s *enginetest.Server, p string) { s.FailNext(p, 500, 2) }, retries: 1, wantCalls: 2,
			wantErr: []string{"HTTP 500", "after 2 attempts"}},
		{name: "no retries", setup: func(s *enginetest.Server, p string) { s.DropNext(p, 1) }, retries: -1, wantCalls: 1,
			wantErr: []string{"EOF"}},
		{name: "400 is final", setup: func(s *enginetest.Server, p string) { s.FailNext(p, 400, 1) }, wantCalls: 1,
			wantErr: []string{"HTTP 400 Bad Request", `"injected failure"`}},
		{name: "404 is final", setup: func(s *enginetest.Server, p string) { s.FailNext(p, 404, 1) }, wantCalls: 1,
			wantErr: []string{"HTTP 404"}},
	}
	for _, e := range bothEngines {
		for _, tt := range tests {
			t.Run(e.kind+"/"+tt.name, func(t *testing.T) {
				srv := serve(t, e)
				tt.setup(srv, e.genPath)
				c := dial(t, e, srv.URL, engines.Options{Retries: tt.retries})
				out, err := c.Generate(context.Background(), [][]int32{{1, 2}}, 1, params)
				if n := srv.Count(e.genPath); n != tt.wantCalls {
					t.Errorf("%d requests, want %d", n, tt.wantCalls)
				}
				if tt.wantErr != nil {
					wantError(t, err, tt.wantErr...)
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if len(out) != 1 || len(out[0]) != 1 || len(out[0][0].Tokens) != params.MaxNewTokens {
					t.Errorf("got %+v", out)
				}
			})
		}
	}
}

func TestTimeout(t *testing.T) {
	for _, e := range bothEngines {
		t.Run(e.kind, func(t *testing.T) {
			noLeaks(t)
			srv := serve(t, e)
			srv.Hang(e.genPath)
			const timeout = 200 * time.Millisecond
			c := dial(t, e, srv.URL, engines.Options{Timeout: timeout, Retries: 1})
			t0 := time.Now()
			err := within(t, 5*time.Second, func() error {
				_, err := c.Generate(context.Background(), [][]int32{{1}}, 1, params)
				return err
			})
			elapsed := time.Since(t0)
			wantError(t, err, e.kind+" generate prompt 0", e.genPath, "no answer within the timeout of 200ms", "after 2 attempts")
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v is not context.DeadlineExceeded", err)
			}
			if elapsed < 2*timeout || elapsed > 2*timeout+time.Second {
				t.Errorf("returned after %v, want two timeouts of %v", elapsed, timeout)
			}
			if n := srv.Count(e.genPath); n != 2 {
				t.Errorf("%d requests, want 2", n)
			}
		})
	}
}

func TestTimeoutThenSuccess(t *testing.T) {
	for _, e := range bothEngines {
		t.Run(e.kind, func(t *testing.T) {
			srv := serve(t, e)
			srv.HangNext(e.genPath, 1)
			c := dial(t, e, srv.URL, engines.Options{Timeout: 100 * time.Millisecond})
			if _, err := c.Generate(context.Background(), [][]int32{{1}}, 1, params); err != nil {
				t.Fatal(err)
			}
			if n := srv.Count(e.genPath); n != 2 {
				t.Errorf("%d requests, want 2", n)
			}
		})
	}
}

func TestCancel(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(s *enginetest.Server, path string)
		backoff time.Duration
		before  bool // cancel before the call
	}{
		{name: "hanging requests", setup: func(s *enginetest.Server, p string) { s.Hang(p) }},
		{name: "waiting to retry", setup: func(s *enginetest.Server, p string) { s.FailNext(p, 503, -1) }, backoff: time.Hour},
		{name: "before the call", setup: func(*enginetest.Server, string) {}, before: true},
	}
	for _, e := range bothEngines {
		for _, tt := range tests {
			t.Run(e.kind+"/"+tt.name, func(t *testing.T) {
				noLeaks(t)
				srv := serve(t, e)
				tt.setup(srv, e.genPath)
				c := dial(t, e, srv.URL, engines.Options{Timeout: time.Hour, Retries: 100, Concurrency: 4})
				if tt.backoff > 0 {
					engines.SetBackoff(c, tt.backoff, tt.backoff)
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tt.before {
					cancel()
				} else {
					time.AfterFunc(100*time.Millisecond, cancel)
				}
				t0 := time.Now()
				err := within(t, 5*time.Second, func() error {
					_, err := c.Generate(ctx, [][]int32{{1}, {2}, {3}}, 2, params)
					return err
				})
				if elapsed := time.Since(t0); elapsed > time.Second {
					t.Errorf("returned %v after the call, want promptly after the cancellation", elapsed)
				}
				wantError(t, err, e.kind+" generate", e.genPath, "context canceled")
				if !errors.Is(err, context.Canceled) {
					t.Errorf("error %v is not context.Canceled", err)
				}
				if tt.before && srv.Count(e.genPath) != 0 {
					t.Errorf("%d requests after a cancelled context", srv.Count(e.genPath))
				}
				waitFor(t, "the server's requests to end", func() bool { return srv.InFlight(e.genPath) == 0 })
			})
		}
	}
}

func TestCancelControl(t *testing.T) {
	for _, e := range bothEngines {
		t.Run(e.kind, func(t *testing.T) {
			noLeaks(t)
			srv := serve(t, e)
			c := dial(t, e, srv.URL, engines.Options{})
			path := map[string]string{engines.KindSGLang: "/update_weights_from_disk", engines.KindOpenAI: "/collective_rpc"}[e.kind]
			srv.Hang(path)
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			t0 := time.Now()
			err := within(t, 5*time.Second, func() error { return c.ReloadFromDisk(ctx, "/x") })
			if elapsed := time.Since(t0); elapsed > time.Second {
				t.Errorf("returned after %v", elapsed)
			}
			wantError(t, err, e.kind+" reload_from_disk", path)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v is not the context's", err)
			}
		})
	}
}

func TestFailureCancelsOthers(t *testing.T) {
	for _, e := range bothEngines {
		t.Run(e.kind, func(t *testing.T) {
			noLeaks(t)
			srv := serve(t, e)
			srv.FailNext(e.genPath, 400, 1)
			srv.Hang(e.genPath)
			c := dial(t, e, srv.URL, engines.Options{Concurrency: 4, Timeout: time.Hour})
			prompts := make([][]int32, 8)
			for i := range prompts {
				prompts[i] = []int32{int32(i + 1)}
			}
			t0 := time.Now()
			err := within(t, 5*time.Second, func() error {
				_, err := c.Generate(context.Background(), prompts, 2, params)
				return err
			})
			if elapsed := time.Since(t0); elapsed > 2*time.Second {
				t.Errorf("returned after %v, want promptly after the failure", elapsed)
			}
			wantError(t, err, "HTTP 400", `"injected failure"`)
			if errors.Is(err, context.Canceled) {
				t.Errorf("got the cancellation of another request, want the failure: %v", err)
			}
			if n := srv.Count(e.genPath); n > 4 {
				t.Errorf("%d requests, want at most the 4 in flight when one failed", n)
			}
			waitFor(t, "the hanging requests to be cancelled", func() bool { return srv.InFlight(e.genPath) == 0 })
		})
	}
}

func TestConcurrency(t *testing.T) {
	for _, e := range bothEngines {
		for _, calls := range []int{1, 3} {
			t.Run(e.kind+"/"+string(rune('0'+calls))+" calls", func(t *testing.T) {
				srv := serve(t, e)
				srv.SetDelay(e.genPath, 20*time.Millisecond)
				const conc = 4
				c := dial(t, e, srv.URL, engines.Options{Concurrency: conc})
				prompts := make([][]int32, 12)
				for i := range prompts {
					prompts[i] = []int32{int32(i + 1), 7}
				}
				var wg sync.WaitGroup
				errs := make([]error, calls)
				for k := range calls {
					wg.Go(func() {
						out, err := c.Generate(context.Background(), prompts, 2, params)
						if err == nil && (len(out) != len(prompts) || len(out[11]) != 2 || len(out[11][1].Tokens) == 0) {
							err = errors.New("incomplete result")
						}
						errs[k] = err
					})
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
				if got := srv.MaxInFlight(e.genPath); got != conc {
					t.Errorf("at most %d requests in flight, want %d", got, conc)
				}
				want := len(prompts) * calls
				if e.perSample {
					want *= 2
				}
				if n := srv.Count(e.genPath); n != want {
					t.Errorf("%d requests, want %d", n, want)
				}
			})
		}
	}
}

func TestErrorMessages(t *testing.T) {
	long := `{"error":{"message":"too long"},"pad":"` + strings.Repeat("x", 600) + `TAIL"}`
	tests := []struct {
		name  string
		setup func(s *enginetest.Server, path string)
		want  map[string][]string // by engine kind
		not   []string
	}{
		{name: "400 with a message",
			setup: func(s *enginetest.Server, p string) {
				s.PassNext(p, 1)
				s.RespondNext(p, 400, `{"error":{"message":"The input (9000 tokens) is longer than the model's context length (8192 tokens)."}}`, 1)
			},
			want: map[string][]string{
				engines.KindSGLang: {"sglang generate prompt 1 sample 0: POST http://", "/generate: HTTP 400 Bad Request: ", `"The input (9000 tokens) is longer than the model's context length (8192 tokens)."`, `; body: {"error":`},
				engines.KindOpenAI: {"openai generate prompt 1: POST http://", "/v1/completions: HTTP 400 Bad Request: ", `"The input (9000 tokens)`},
			}},
		{name: "long body is cut",
			setup: func(s *enginetest.Server, p string) { s.RespondNext(p, 422, long, 1) },
			want: map[string][]string{
				engines.KindSGLang: {"prompt 0 sample 0", "HTTP 422 Unprocessable Entity", `"too long"`, "xxx..."},
				engines.KindOpenAI: {"prompt 0", "HTTP 422", `"too long"`, "xxx..."},
			},
			not: []string{"TAIL"}},
		{name: "plain-text 500",
			setup: func(s *enginetest.Server, p string) { s.RespondNext(p, 500, "Internal Server Error", -1) },
			want: map[string][]string{
				engines.KindSGLang: {"HTTP 500 Internal Server Error; body: Internal Server Error; after 2 attempts"},
				engines.KindOpenAI: {"HTTP 500 Internal Server Error; body: Internal Server Error; after 2 attempts"},
			}},
	}
	for _, e := range bothEngines {
		for _, tt := range tests {
			t.Run(e.kind+"/"+tt.name, func(t *testing.T) {
				srv := serve(t, e)
				tt.setup(srv, e.genPath)
				c := dial(t, e, srv.URL, engines.Options{Concurrency: 1, Retries: 1})
				_, err := c.Generate(context.Background(), [][]int32{{1}, {2}}, 1, params)
				wantError(t, err, tt.want[e.kind]...)
				for _, s := range tt.not {
					if err != nil && strings.Contains(err.Error(), s) {
						t.Errorf("error %q contains %q", err, s)
					}
				}
				var ee *engines.Error
				if !errors.As(err, &ee) {
					t.Fatalf("error %T is not *engines.Error", err)
				}
				if ee.Engine != e.kind || ee.Op != "generate" || ee.Method != http.MethodPost || ee.URL != srv.URL+e.genPath || ee.StatusCode < 400 || len(ee.Body) > 512+3 {
					t.Errorf("error fields %+v", ee)
				}
			})
		}
	}
}

func TestDeadEngine(t *testing.T) {
	for _, e := range bothEngines {
		t.Run(e.kind, func(t *testing.T) {
			srv := e.start(nil)
			url := srv.URL
			srv.Close()
			c := dial(t, e, url, engines.Options{})
			calls := []struct {
				op   string
				call func(context.Context) error
			}{
				{"generate", func(ctx context.Context) error {
					_, err := c.Generate(ctx, [][]int32{{1}, {2}}, 2, params)
					return err
				}},
				{"reload_from_disk", func(ctx context.Context) error { return c.ReloadFromDisk(ctx, "/x") }},
				{"release_memory", func(ctx context.Context) error { return c.ReleaseMemory(ctx) }},
				{"resume_memory", func(ctx context.Context) error { return c.ResumeMemory(ctx) }},
				{"health", func(ctx context.Context) error { return c.Health(ctx) }},
			}
			for _, call := range calls {
				t0 := time.Now()
				err := call.call(context.Background())
				if time.Since(t0) > 2*time.Second {
					t.Errorf("%s took %v", call.op, time.Since(t0))
				}
				wantError(t, err, e.kind+" "+call.op, url, "connection refused")
				if call.op != "health" {
					wantError(t, err, "after 4 attempts")
				}
			}
		})
	}
}

func TestOptions(t *testing.T) {
	tests := []struct {
		name                 string
		url                  string
		o                    engines.Options
		wantErr              string
		conc, retries        int
		timeout              time.Duration
		wantBase, wantOpenAI string
	}{
		{name: "defaults", url: "http://h:1", conc: 64, retries: 3, timeout: 10 * time.Minute, wantBase: "http://h:1", wantOpenAI: "http://h:1"},
		{name: "set", url: "https://h/prefix/", o: engines.Options{Concurrency: 2, Retries: 7, Timeout: time.Second}, conc: 2, retries: 7, timeout: time.Second,
			wantBase: "https://h/prefix", wantOpenAI: "https://h/prefix"},
		{name: "no retries", url: "http://h:1/v1", o: engines.Options{Retries: -1}, conc: 64, retries: 0, timeout: 10 * time.Minute,
			wantBase: "http://h:1/v1", wantOpenAI: "http://h:1"},
		{name: "no scheme", url: "localhost:30000", wantErr: "want http:// or https://"},
		{name: "empty", url: "", wantErr: "want http:// or https://"},
		{name: "ftp", url: "ftp://h", wantErr: "want http:// or https://"},
		{name: "query", url: "http://h?x=1", wantErr: "want no query"},
		{name: "bad", url: "http://h:port:x", wantErr: "base URL"},
		{name: "negative concurrency", url: "http://h", o: engines.Options{Concurrency: -1}, wantErr: "concurrency"},
		{name: "negative timeout", url: "http://h", o: engines.Options{Timeout: -time.Second}, wantErr: "timeout"},
	}
	for _, e := range bothEngines {
		for _, tt := range tests {
			t.Run(e.kind+"/"+tt.name, func(t *testing.T) {
				c, err := e.newClient(tt.url, tt.o)
				if tt.wantErr != "" {
					wantError(t, err, e.kind+": ", tt.wantErr)
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				conc, timeout, retries, base := engines.Settings(c)
				want := tt.wantBase
				if e.kind == engines.KindOpenAI {
					want = tt.wantOpenAI
				}
				if conc != tt.conc || timeout != tt.timeout || retries != tt.retries || base != want {
					t.Errorf("got %d, %v, %d, %q; want %d, %v, %d, %q", conc, timeout, retries, base, tt.conc, tt.timeout, tt.retries, tt.wantBase)
				}
			})
		}
	}
}

func TestBackoff(t *testing.T) {
	c, err := engines.NewSGLang("http://h", engines.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := time.Second
	tests := []struct {
		attempt int
		after   time.Duration
		want    time.Duration
	}{
		{1, 0, s / 2}, {2, 0, s}, {3, 0, 2 * s}, {4, 0, 4 * s}, {5, 0, 8 * s}, {6, 0, 8 * s}, {60, 0, 8 * s},
		{1, 3 * s, 3 * s}, {4, s, 4 * s}, {1, time.Minute, 8 * s},
	}
	for _, tt := range tests {
		if got := engines.Delay(c, tt.attempt, tt.after); got != tt.want {
			t.Errorf("delay after attempt %d (Retry-After %v) = %v, want %v", tt.attempt, tt.after, got, tt.want)
		}
	}
	for v, want := range map[string]time.Duration{"": 0, "2": 2 * s, " 5 ": 5 * s, "-3": 0, "soon": 0, "Mon, 02 Jan 2006 15:04:05 GMT": 0} {
		if got := engines.RetryAfter(v); got != want {
			t.Errorf("Retry-After %q = %v, want %v", v, got, want)
		}
	}
}

func TestGenerateArguments(t *testing.T) {
	tests := []struct {
		name    string
		prompts [][]int32
		n       int
		p       engines.Params
		wantErr string
	}{
		{name: "n 0", prompts: [][]int32{{1}}, n: 0, p: params, wantErr: "n must be at least 1"},
		{name: "max_new_tokens 0", prompts: [][]int32{{1}}, n: 1, p: engines.Params{}, wantErr: "max_new_tokens must be at least 1"},
		{name: "top_k negative", prompts: [][]int32{{1}}, n: 1, p: engines.Params{MaxNewTokens: 1, TopK: -1}, wantErr: "top_k"},
		{name: "top_p above 1", prompts: [][]int32{{1}}, n: 1, p: engines.Params{MaxNewTokens: 1, TopP: 1.5}, wantErr: "top_p"},
		{name: "negative temperature", prompts: [][]int32{{1}}, n: 1, p: engines.Params{MaxNewTokens: 1, Temperature: -1}, wantErr: "temperature"},
		{name: "stop id out of range", prompts: [][]int32{{1}}, n: 1, p: engines.Params{MaxNewTokens: 1, StopTokenIDs: []int{-2}}, wantErr: "stop token id -2"},
		{name: "empty prompt", prompts: [][]int32{{1}, {}}, n: 1, p: params, wantErr: "prompt 1 is empty"},
		{name: "no prompts", prompts: nil, n: 4, p: params},
	}
	for _, e := range bothEngines {
		for _, tt := range tests {
			t.Run(e.kind+"/"+tt.name, func(t *testing.T) {
				srv := serve(t, e)
				c := dial(t, e, srv.URL, engines.Options{})
				out, err := c.Generate(context.Background(), tt.prompts, tt.n, tt.p)
				if tt.wantErr != "" {
					wantError(t, err, e.kind+" generate: ", tt.wantErr)
				} else if err != nil || len(out) != 0 {
					t.Errorf("got %v, %v; want an empty result", out, err)
				}
				if n := srv.Count(e.genPath); n != 0 {
					t.Errorf("%d requests, want none", n)
				}
			})
		}
	}
}

func TestAbortIsFinal(t *testing.T) {
	for _, e := range bothEngines {
		t.Run(e.kind, func(t *testing.T) {
			srv := serve(t, e)
			srv.AbortNext(1)
			c := dial(t, e, srv.URL, engines.Options{})
			_, err := c.Generate(context.Background(), [][]int32{{1}}, 1, params)
			wantError(t, err, e.kind+" generate prompt 0", "abort")
			if n := srv.Count(e.genPath); n != 1 {
				t.Errorf("%d requests, want 1", n)
			}
		})
	}
}
