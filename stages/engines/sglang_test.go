package engines_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/rlpipe/rlpipe/stages/engines"
	"github.com/rlpipe/rlpipe/stages/engines/enginetest"
)

var sglangEngine = bothEngines[0]

func TestSGLangDecode(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    engines.Response
		wantErr []string
	}{
		{name: "stop with matched int; ids from the log-probs, not output_ids",
			body: `{"text":"ab","output_ids":[7],"meta_info":{"id":"1","finish_reason":{"type":"stop","matched":8},"prompt_tokens":3,"completion_tokens":2,"output_token_logprobs":[[-0.25,7,null],[-1.5,8,null]]}}`,
			want: engines.Response{Tokens: []int32{7, 8}, LogProbs: []float32{-0.25, -1.5}, Finish: "stop"}},
		{name: "length with texts in the entries",
			body: `{"meta_info":{"finish_reason":{"type":"length","length":3},"output_token_logprobs":[[-0.5,1,"a"],[0,2,"b"],[-3e-2,2147483647,"c"]]}}`,
			want: engines.Response{Tokens: []int32{1, 2, 2147483647}, LogProbs: []float32{-0.5, 0, -0.03}, Finish: "length"}},
		{name: "matched as a string",
			body: `{"meta_info":{"finish_reason":{"type":"stop","matched":"</s>"},"output_token_logprobs":[[-1,5,null]]}}`,
			want: engines.Response{Tokens: []int32{5}, LogProbs: []float32{-1}, Finish: "stop"}},
		{name: "matched as a list, extra fields",
			body: `{"meta_info":{"finish_reason":{"type":"stop","matched":[5,6]},"output_token_logprobs":[[-1,5,null]],"weight_version":"default","spec_verify_ct":0}}`,
			want: engines.Response{Tokens: []int32{5}, LogProbs: []float32{-1}, Finish: "stop"}},
		{name: "a batch of one",
			body: `[{"meta_info":{"finish_reason":{"type":"length"},"output_token_logprobs":[[-2,9,null]]}}]`,
			want: engines.Response{Tokens: []int32{9}, LogProbs: []float32{-2}, Finish: "length"}},
		{name: "abort", body: `{"meta_info":{"finish_reason":{"type":"abort","message":"out of memory"},"output_token_logprobs":[]}}`,
			wantErr: []string{"aborted", `"out of memory"`, "HTTP 200", "prompt 0 sample 0"}},
		{name: "null log-prob", body: `{"meta_info":{"finish_reason":{"type":"stop"},"output_token_logprobs":[[-1,5,null],[null,6,null]]}}`,
			wantErr: []string{"output_token_logprobs[1]", "null"}},
		{name: "fractional id", body: `{"meta_info":{"finish_reason":{"type":"stop"},"output_token_logprobs":[[-1,5.5,null]]}}`,
			wantErr: []string{"5.5", "not an integer"}},
		{name: "id out of range", body: `{"meta_info":{"finish_reason":{"type":"stop"},"output_token_logprobs":[[-1,2147483648,null]]}}`,
			wantErr: []string{"out of range"}},
		{name: "short entry", body: `{"meta_info":{"finish_reason":{"type":"stop"},"output_token_logprobs":[[-1]]}}`,
			wantErr: []string{"got 1 values"}},
		{name: "no meta_info", body: `{"text":""}`, wantErr: []string{"no meta_info"}},
		{name: "no finish_reason", body: `{"meta_info":{"finish_reason":null,"output_token_logprobs":[]}}`, wantErr: []string{"no meta_info.finish_reason"}},
		{name: "no log-probs", body: `{"meta_info":{"finish_reason":{"type":"stop"},"output_ids":[1]}}`, wantErr: []string{"no meta_info.output_token_logprobs"}},
		{name: "unknown finish", body: `{"meta_info":{"finish_reason":{"type":"paused"},"output_token_logprobs":[]}}`, wantErr: []string{`unknown finish_reason type "paused"`}},
		{name: "not JSON", body: `<html>oops</html>`, wantErr: []string{"decoding the answer", "HTTP 200", "<html>oops</html>"}},
		{name: "a batch of two", body: `[{},{}]`, wantErr: []string{"list of 2 results"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := serve(t, sglangEngine)
			srv.RespondNext("/generate", 200, tt.body, 1)
			c := dial(t, sglangEngine, srv.URL, engines.Options{})
			out, err := c.Generate(context.Background(), [][]int32{{1, 2, 3}}, 1, engines.Params{MaxNewTokens: 4})
			if tt.wantErr != nil {
				wantError(t, err, tt.wantErr...)
				if n := srv.Count("/generate"); n != 1 {
					t.Errorf("%d requests, want 1 (a malformed answer is not retried)", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(out, [][]engines.Response{{tt.want}}) {
				t.Errorf("got %+v, want %+v", out, tt.want)
			}
		})
	}
}

func TestSGLangRequests(t *testing.T) {
	prompts := [][]int32{{10, 11, 12}, {20}}
	tests := []struct {
		name string
		n    int
		p    engines.Params
		// want returns the sampling_params of request k as JSON.
		want func(k int) string
	}{
		{name: "defaults off", n: 2, p: engines.Params{MaxNewTokens: 5, Temperature: 1, TopP: 1},
			want: func(int) string {
				return `{"ignore_eos":false,"max_new_tokens":5,"no_stop_trim":true,"skip_special_tokens":false,"temperature":1,"top_k":-1,"top_p":1}`
			}},
		{name: "everything on", n: 3, p: engines.Params{MaxNewTokens: 7, Temperature: 0.6, TopP: 0.9, TopK: 20, StopTokenIDs: []int{2, 151645}, IgnoreEOS: true, Seed: 1000},
			want: func(k int) string {
				return fmt.Sprintf(`{"ignore_eos":true,"max_new_tokens":7,"no_stop_trim":true,"sampling_seed":%d,"skip_special_tokens":false,"stop_token_ids":[2,151645],"temperature":0.6,"top_k":20,"top_p":0.9}`, 1000+k)
			}},
		{name: "top_p 0 is off, greedy", n: 1, p: engines.Params{MaxNewTokens: 1, Temperature: 0, Seed: -5},
			want: func(k int) string {
				return fmt.Sprintf(`{"ignore_eos":false,"max_new_tokens":1,"no_stop_trim":true,"sampling_seed":%d,"skip_special_tokens":false,"temperature":0,"top_k":-1,"top_p":1}`, -5+k)
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := serve(t, sglangEngine)
			c := dial(t, sglangEngine, srv.URL+"/", engines.Options{Concurrency: 1})
			out, err := c.Generate(context.Background(), prompts, tt.n, tt.p)
			if err != nil {
				t.Fatal(err)
			}
			reqs := srv.Requests("/generate")
			if len(reqs) != len(prompts)*tt.n {
				t.Fatalf("%d requests, want one per prompt and sample: %d", len(reqs), len(prompts)*tt.n)
			}
			for k, r := range reqs { // one worker: in order
				i, j := k/tt.n, k%tt.n
				ids, _ := json.Marshal(prompts[i])
				want := fmt.Sprintf(`{"input_ids":%s,"return_logprob":true,"sampling_params":%s}`, ids, tt.want(k))
				if got := canonical(t, r.Body); got != canonical(t, []byte(want)) {
					t.Errorf("request %d:\n got %s\nwant %s", k, got, want)
				}
				if r.Method != "POST" || r.Query != "" {
					t.Errorf("request %d: %s ?%s", k, r.Method, r.Query)
				}
				sp := tt.p
				if sp.Seed != 0 {
					sp.Seed += int64(k)
				}
				if sp.TopP == 0 {
					sp.TopP = 1
				}
				want0 := enginetest.Counting(prompts[i], 1, sp)[0]
				if !reflect.DeepEqual(out[i][j], want0) {
					t.Errorf("result [%d][%d] = %+v, want %+v", i, j, out[i][j], want0)
				}
			}
		})
	}
}

func TestSGLangControl(t *testing.T) {
	tests := []controlCase{
		{name: "reload", call: reload("/ckpt/step-3"), check: func(t *testing.T, s *enginetest.Server) {
			if s.ModelPath() != "/ckpt/step-3" || s.Reloads() != 1 {
				t.Errorf("model path %q after %d reloads", s.ModelPath(), s.Reloads())
			}
			wantBody(t, s, "/update_weights_from_disk", `{"model_path":"/ckpt/step-3"}`)
		}},
		{name: "reload success false with 200",
			setup:   respond("/update_weights_from_disk", 200, `{"success":false,"message":"Failed to get weights iterator","num_paused_requests":[0,0]}`),
			call:    reload("/x"),
			wantErr: []string{"sglang reload_from_disk", "POST", "/update_weights_from_disk", "HTTP 200", `"Failed to get weights iterator"`, "did not load"}},
		{name: "reload success false with 400",
			setup:   respond("/update_weights_from_disk", 400, `{"success":false,"message":"no such dir","num_paused_requests":0}`),
			call:    reload("/x"),
			wantErr: []string{"HTTP 400 Bad Request", `"no such dir"`},
			check:   count("/update_weights_from_disk", 1)},
		{name: "reload empty answer", setup: respond("/update_weights_from_disk", 200, ``), call: reload("/x")},
		{name: "reload plain-text answer", setup: respond("/update_weights_from_disk", 200, `ok`), call: reload("/x")},
		{name: "reload retried on 503", setup: fail("/update_weights_from_disk", 503, 2), call: reload("/y"),
			check: func(t *testing.T, s *enginetest.Server) {
				if s.Count("/update_weights_from_disk") != 3 || s.ModelPath() != "/y" {
					t.Errorf("%d requests, model path %q", s.Count("/update_weights_from_disk"), s.ModelPath())
				}
			}},
		{name: "release", call: engines.Client.ReleaseMemory, check: func(t *testing.T, s *enginetest.Server) {
			if !s.Released() || s.Releases() != 1 {
				t.Errorf("released %v after %d releases", s.Released(), s.Releases())
			}
			wantBody(t, s, "/release_memory_occupation", `{}`)
		}},
		{name: "release then resume", call: func(c engines.Client, ctx context.Context) error {
			if err := c.ReleaseMemory(ctx); err != nil {
				return err
			}
			return c.ResumeMemory(ctx)
		}, check: func(t *testing.T, s *enginetest.Server) {
			if s.Released() || s.Resumes() != 1 {
				t.Errorf("released %v after %d resumes", s.Released(), s.Resumes())
			}
			wantBody(t, s, "/resume_memory_occupation", `{}`)
		}},
		{name: "release empty answer", setup: respond("/release_memory_occupation", 200, ``), call: engines.Client.ReleaseMemory},
		{name: "resume text answer", setup: respond("/resume_memory_occupation", 200, `OK`), call: engines.Client.ResumeMemory},
		{name: "release 400", setup: respond("/release_memory_occupation", 400, `{"error":{"message":"memory is already released"}}`),
			call:    engines.Client.ReleaseMemory,
			wantErr: []string{"sglang release_memory", "/release_memory_occupation", "HTTP 400", `"memory is already released"`}},
		{name: "health", call: engines.Client.Health, check: func(t *testing.T, s *enginetest.Server) {
			if got := s.Paths(); !reflect.DeepEqual(got, []string{"/health_generate"}) {
				t.Errorf("paths %q", got)
			}
		}},
		{name: "health falls back to /health", setup: respond("/health_generate", 404, `{"detail":"Not Found"}`), call: engines.Client.Health,
			check: func(t *testing.T, s *enginetest.Server) {
				if got := s.Paths(); !reflect.DeepEqual(got, []string{"/health_generate", "/health"}) {
					t.Errorf("paths %q", got)
				}
			}},
		{name: "health 503 is not retried", setup: respond("/health_generate", 503, ``), call: engines.Client.Health,
			wantErr: []string{"sglang health", "GET", "/health_generate", "HTTP 503"},
			check:   count("/health_generate", 1)},
	}
	runControl(t, sglangEngine, tests)
}

// reload returns a call of ReloadFromDisk(dir).
func reload(dir string) func(engines.Client, context.Context) error {
	return func(c engines.Client, ctx context.Context) error { return c.ReloadFromDisk(ctx, dir) }
}

// respond returns a setup answering the next request on path.
func respond(path string, status int, body string) func(*enginetest.Server) {
	return func(s *enginetest.Server) { s.RespondNext(path, status, body, 1) }
}

// fail returns a setup failing the next times requests on path.
func fail(path string, status, times int) func(*enginetest.Server) {
	return func(s *enginetest.Server) { s.FailNext(path, status, times) }
}

// count returns a check of the number of requests on path.
func count(path string, want int) func(*testing.T, *enginetest.Server) {
	return func(t *testing.T, s *enginetest.Server) {
		if n := s.Count(path); n != want {
			t.Errorf("%d requests on %s, want %d", n, path, want)
		}
	}
}

// wantBody checks the body of the only request on path.
func wantBody(t *testing.T, s *enginetest.Server, path, want string) {
	t.Helper()
	reqs := s.Requests(path)
	if len(reqs) != 1 {
		t.Fatalf("%d requests on %s, want 1", len(reqs), path)
	}
	if got := canonical(t, reqs[0].Body); got != canonical(t, []byte(want)) {
		t.Errorf("%s body %s, want %s", path, got, want)
	}
}
