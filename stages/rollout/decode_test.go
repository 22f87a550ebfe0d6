package rollout

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestDecodeValid(t *testing.T) {
	ones := func(n int) []float32 {
		m := make([]float32, n)
		for i := range m {
			m[i] = 1
		}
		return m
	}
	tests := []struct {
		name string
		in   string
		want []Sample
	}{
		{
			name: "ours minimal",
			in:   `{"prompt_tokens":[1,2],"response_tokens":[3],"reward":1.0,"group":3}`,
			want: []Sample{{Tokens: []int32{1, 2, 3}, ResponseLength: 1, Reward: 1, LossMask: ones(1), Group: 3, Line: 1}},
		},
		{
			name: "ours full with blank lines and CRLF",
			in: "\n  \n" + `{"prompt_tokens":[0],"response_tokens":[0,7],"reward":-0.5,"group":0,"loss_mask":[1,0],"rollout_log_probs":[-0.25,0]}` + "\r\n\n" +
				`{"group":1,"reward":2e-1,"response_tokens":[5],"prompt_tokens":[4],"loss_mask":[0.5],"rollout_log_probs":[-1.5]}`,
			want: []Sample{
				{Tokens: []int32{0, 0, 7}, ResponseLength: 2, Reward: -0.5, LossMask: []float32{1, 0}, RolloutLogProbs: []float32{-0.25, 0}, Group: 0, Index: 0, Line: 3},
				{Tokens: []int32{4, 5}, ResponseLength: 1, Reward: 0.2, LossMask: []float32{0.5}, RolloutLogProbs: []float32{-1.5}, Group: 1, Index: 1, Line: 5},
			},
		},
		{
			name: "ours null optional fields",
			in:   `{"prompt_tokens":[1],"response_tokens":[2,3],"reward":0,"prompt_id":9,"loss_mask":null,"rollout_log_probs":null}`,
			want: []Sample{{Tokens: []int32{1, 2, 3}, ResponseLength: 2, Reward: 0, LossMask: ones(2), Group: 9, Line: 1}},
		},
		{
			name: "slime dump with informational fields",
			in: `{"group_index":2,"index":17,"prompt":"What is 1+1?","tokens":[10,11,12,0],"multimodal_inputs":null,"response":"2","response_length":2,` +
				`"label":"2","reward":1,"loss_mask":[1,1],"weight_versions":["3"],"rollout_log_probs":[-0.1,-0.2],"rollout_routed_experts":null,` +
				`"remove_sample":false,"teacher_log_probs":null,"status":"completed","metadata":{"a":[1,{"b":2}]},"spec_info":{"spec_verify_ct":0},` +
				`"prefix_cache_info":{"cached_tokens":0},"session_id":null,"non_generation_time":0.5,"train_metadata":null,"generate_function_path":null}`,
			want: []Sample{{Tokens: []int32{10, 11, 12, 0}, ResponseLength: 2, Reward: 1, LossMask: []float32{1, 1},
				RolloutLogProbs: []float32{-0.1, -0.2}, Group: 2, Line: 1}},
		},
		{
			name: "slime with group instead of group_index",
			in:   `{"tokens":[1,2,3],"response_length":1,"reward":0.25,"group":4}`,
			want: []Sample{{Tokens: []int32{1, 2, 3}, ResponseLength: 1, Reward: 0.25, LossMask: ones(1), Group: 4, Line: 1}},
		},
		{
			name: "UTF-8 byte order mark",
			in:   "\xef\xbb\xbf" + `{"prompt_tokens":[1,2],"response_tokens":[3],"reward":1.0,"group":3}`,
			want: []Sample{{Tokens: []int32{1, 2, 3}, ResponseLength: 1, Reward: 1, LossMask: ones(1), Group: 3, Line: 1}},
		},
		{
			name: "largest token id",
			in:   `{"prompt_tokens":[2147483647],"response_tokens":[0],"reward":0,"group":2147483647}`,
			want: []Sample{{Tokens: []int32{MaxTokenID, 0}, ResponseLength: 1, LossMask: ones(1), Group: MaxTokenID, Line: 1}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode("r.jsonl", strings.NewReader(tc.in))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	const ok = `{"prompt_tokens":[1],"response_tokens":[2],"reward":1,"group":0}`
	tests := []struct {
		name string
		in   string
		want []string // the full error, one entry per line of the message
	}{
		{"empty file", "", []string{"r.jsonl: no samples"}},
		{"only blank lines", "\n \n\t\n", []string{"r.jsonl: no samples"}},
		{"syntax", ok + "\n{\"prompt_tokens\":[1,}", []string{"r.jsonl:2: invalid JSON at column 21: invalid character '}' looking for beginning of value"}},
		{"truncated", `{"prompt_tokens":[1]`, []string{"r.jsonl:1: invalid JSON: unexpected end of line"}},
		{"not an object", `[1,2]`, []string{"r.jsonl:1: line is not a JSON object"}},
		{"trailing data", ok + ` {}`, []string{"r.jsonl:1: unexpected data after the JSON object"}},
		{"NaN reward", `{"prompt_tokens":[1],"response_tokens":[2],"reward":NaN,"group":0}`,
			[]string{"r.jsonl:1: reward: NaN is not allowed (not a finite JSON number)"}},
		{"Infinity reward", `{"reward": -Infinity}`,
			[]string{"r.jsonl:1: reward: -Infinity is not allowed (not a finite JSON number)"}},
		{"huge reward", `{"prompt_tokens":[1],"response_tokens":[2],"reward":1e999,"group":0}`,
			[]string{"r.jsonl:1: reward: 1e999 is out of range"}},
		{"unknown field", `{"prompt_tokens":[1],"response_tokens":[2],"reward":1,"group":0,"foo":1,"bar":null}`,
			[]string{`r.jsonl:1: unknown field "foo"`, `r.jsonl:1: unknown field "bar"`}},
		{"slime field in our dialect", `{"prompt_tokens":[1],"response_tokens":[2],"reward":1,"group":0,"status":"completed"}`,
			[]string{`r.jsonl:1: unknown field "status" (slime's informational fields are accepted only on lines with "tokens")`}},
		{"duplicate field", `{"prompt_tokens":[1],"response_tokens":[2],"reward":1,"reward":2,"group":0}`,
			[]string{`r.jsonl:1: duplicate field "reward"`}},
		{"mixed dialects", `{"tokens":[1,2],"prompt_tokens":[1],"response_length":1,"reward":1,"group":0}`,
			[]string{`r.jsonl:1: "tokens" (slime dialect) cannot be combined with "prompt_tokens"/"response_tokens"`}},
		{"no tokens at all", `{"reward":1,"group":0}`,
			[]string{`r.jsonl:1: missing tokens: give "prompt_tokens" and "response_tokens", or slime's "tokens" and "response_length"`}},
		{"missing reward and group", `{"prompt_tokens":[1],"response_tokens":[2]}`,
			[]string{"r.jsonl:1: missing reward", `r.jsonl:1: missing group id: give "group", "group_index" or "prompt_id"`}},
		{"missing response_tokens", `{"prompt_tokens":[1],"reward":1,"group":0}`,
			[]string{"r.jsonl:1: missing response_tokens"}},
		{"two group ids", `{"prompt_tokens":[1],"response_tokens":[2],"reward":1,"group":0,"group_index":0}`,
			[]string{`r.jsonl:1: several group ids ("group" and "group_index"): give only one`}},
		{"wrong types", `{"prompt_tokens":"abc","response_tokens":[2,"x"],"reward":"1","group":1.5}`,
			[]string{"r.jsonl:1: prompt_tokens: want an array, got a string", `r.jsonl:1: response_tokens[1]: want a number, got a string`,
				"r.jsonl:1: reward: want a number, got a string", "r.jsonl:1: group: 1.5 is not an integer"}},
		{"null reward", `{"prompt_tokens":[1],"response_tokens":[2],"reward":null,"group":0}`,
			[]string{"r.jsonl:1: reward: want a number, got null"}},
		{"negative token", `{"prompt_tokens":[1,-3],"response_tokens":[2],"reward":1,"group":0}`,
			[]string{"r.jsonl:1: prompt_tokens[1]: -3 is negative"}},
		{"huge token", `{"prompt_tokens":[1],"response_tokens":[2147483648],"reward":1,"group":0}`,
			[]string{"r.jsonl:1: response_tokens[0]: 2147483648 exceeds the largest token id 2147483647"}},
		{"very huge token", `{"tokens":[1,99999999999999999999999],"response_length":1,"reward":1,"group":0}`,
			[]string{"r.jsonl:1: tokens[1]: 99999999999999999999999 exceeds the largest token id 2147483647"}},
		{"fractional token", `{"tokens":[1,2.0],"response_length":1,"reward":1,"group":0}`,
			[]string{"r.jsonl:1: tokens[1]: 2.0 is not an integer token id"}},
		{"negative group", `{"tokens":[1,2],"response_length":1,"reward":1,"group_index":-1}`,
			[]string{"r.jsonl:1: group_index: -1 is outside [0, 2147483647]"}},
		{"R too large", `{"tokens":[1,2],"response_length":3,"reward":1,"group_index":0}`,
			[]string{"r.jsonl:1: response_length 3 must be less than the 2 tokens (at least one prompt token is needed)"}},
		{"R equals len", `{"tokens":[1,2],"response_length":2,"reward":1,"group_index":0}`,
			[]string{"r.jsonl:1: response_length 2 must be less than the 2 tokens (at least one prompt token is needed)"}},
		{"R zero", `{"tokens":[1,2],"response_length":0,"reward":1,"group_index":0}`,
			[]string{"r.jsonl:1: response_length must be positive, got 0"}},
		{"missing R", `{"tokens":[1,2],"reward":1,"group_index":0}`,
			[]string{"r.jsonl:1: missing response_length"}},
		{"empty tokens", `{"tokens":[],"response_length":1,"reward":1,"group_index":0}`,
			[]string{"r.jsonl:1: tokens is empty"}},
		{"empty prompt and response", `{"prompt_tokens":[],"response_tokens":[],"reward":1,"group":0}`,
			[]string{"r.jsonl:1: prompt_tokens is empty (at least one prompt token is needed)", "r.jsonl:1: response_tokens is empty"}},
		{"response_length in our dialect", `{"prompt_tokens":[1],"response_tokens":[2],"response_length":1,"reward":1,"group":0}`,
			[]string{`r.jsonl:1: field "response_length" belongs to the slime dialect (with "tokens"); with "response_tokens" it is implied`}},
		{"mask length", `{"prompt_tokens":[1],"response_tokens":[2,3],"reward":1,"group":0,"loss_mask":[1]}`,
			[]string{"r.jsonl:1: loss_mask has 1 entries, want response_length 2"}},
		{"mask value", `{"prompt_tokens":[1],"response_tokens":[2,3],"reward":1,"group":0,"loss_mask":[1,2]}`,
			[]string{"r.jsonl:1: loss_mask[1]: 2 is outside [0, 1]"}},
		{"logprob length", `{"tokens":[1,2,3],"response_length":2,"reward":1,"group_index":0,"rollout_log_probs":[-1,-2,-3]}`,
			[]string{"r.jsonl:1: rollout_log_probs has 3 entries, want response_length 2"}},
		{"positive logprob", `{"tokens":[1,2,3],"response_length":2,"reward":1,"group_index":0,"rollout_log_probs":[-1,0.5]}`,
			[]string{"r.jsonl:1: rollout_log_probs[1]: 0.5 is positive (log-probs are ≤ 0)"}},
		{"slime unsupported", `{"tokens":[1,2],"response_length":1,"reward":1,"group_index":0,"teacher_log_probs":[-1]}`,
			[]string{`r.jsonl:1: field "teacher_log_probs" is not supported by rlpipe (only null is accepted)`}},
		{"slime removed sample", `{"tokens":[1,2],"response_length":1,"reward":1,"group_index":0,"remove_sample":true}`,
			[]string{"r.jsonl:1: remove_sample is true: filter removed samples out before writing the file"}},
		{"slime dict reward", `{"tokens":[1,2],"response_length":1,"reward":{"acc":1},"group_index":0}`,
			[]string{"r.jsonl:1: reward: want a number, got an object"}},
		{"logprobs on some lines only", ok + "\n" + `{"prompt_tokens":[1],"response_tokens":[2],"reward":1,"group":0,"rollout_log_probs":[-1]}` + "\n\n" + ok + "\n",
			[]string{"r.jsonl:2: rollout_log_probs given, but line 1 has none (give them on every line or on none)"}},
		{"errors on several lines with exact numbers", ok + "\n\n" + `{"prompt_tokens":[1]}` + "\n" + ok + "\n" + `{"x":1,` + "\n",
			[]string{"r.jsonl:3: missing reward",
				`r.jsonl:3: missing group id: give "group", "group_index" or "prompt_id"`, "r.jsonl:3: missing response_tokens", "r.jsonl:5: invalid JSON: unexpected end of line"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode("r.jsonl", strings.NewReader(tc.in))
			if err == nil {
				t.Fatalf("Decode succeeded with %+v, want an error", got)
			}
			// The samples returned are those of the lines that decoded
			// (the all-or-none rule of rollout log-probs spans lines).
			for _, sm := range got {
				if strings.Contains(err.Error(), fmt.Sprintf("r.jsonl:%d:", sm.Line)) && !strings.Contains(err.Error(), "on every line or on none") {
					t.Errorf("Decode returned the sample of line %d, which has an error", sm.Line)
				}
			}
			if lines := strings.Split(err.Error(), "\n"); !reflect.DeepEqual(lines, tc.want) {
				t.Errorf("error:\n%s\nwant:\n%s", err, strings.Join(tc.want, "\n"))
			}
		})
	}
}

func TestDecodeErrorCap(t *testing.T) {
	var b strings.Builder
	for range 25 {
		b.WriteString(`{"prompt_tokens":[1],"response_tokens":[2],"reward":1,"group":0,"x":0}` + "\n")
	}
	_, err := Decode("r.jsonl", strings.NewReader(b.String()))
	var list ErrorList
	if !errors.As(err, &list) || len(list) != 25 {
		t.Fatalf("want an ErrorList of 25, got %T %v", err, err)
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 21 || lines[19] != `r.jsonl:20: unknown field "x"` || lines[20] != "... and 5 more" {
		t.Errorf("capped message wrong:\n%s", err)
	}
	var le *LineError
	if !errors.As(err, &le) || le.Line != 1 {
		t.Errorf("errors.As LineError: %v", le)
	}
}

func TestDecodeLongLine(t *testing.T) {
	const n = 40000 // about 240 KiB of text on one line
	var b strings.Builder
	b.WriteString(`{"prompt_tokens":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d", 100000+i)
	}
	b.WriteString(`],"response_tokens":[0,0,5],"reward":0.5,"group":1}` + "\n")
	line := b.String()
	if len(line) <= 64<<10 {
		t.Fatalf("test line is only %d bytes", len(line))
	}
	got, err := Decode("long.jsonl", strings.NewReader(line+line))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || len(got[1].Tokens) != n+3 || got[1].Line != 2 || got[1].Tokens[n-1] != 100000+n-1 || got[1].Tokens[n] != 0 {
		t.Errorf("long lines decoded wrongly: %d samples", len(got))
	}
}

func TestReadMissingFile(t *testing.T) {
	if _, err := Read(filepath.Join(t.TempDir(), "nope.jsonl")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("got %v, want not-exist", err)
	}
}

func TestValidate(t *testing.T) {
	good := func() Sample {
		return Sample{Tokens: []int32{1, 0, 2}, ResponseLength: 2, LossMask: []float32{1, 1}, Index: 4, Line: 9}
	}
	tests := []struct {
		name   string
		mutate func(*Sample)
		want   string
	}{
		{"valid", func(*Sample) {}, ""},
		{"no tokens", func(s *Sample) { s.Tokens = nil }, "sample 4 (line 9): tokens is empty"},
		{"R = len", func(s *Sample) { s.ResponseLength = 3; s.LossMask = []float32{1, 1, 1} },
			"sample 4 (line 9): response_length 3 must be less than the 3 tokens (at least one prompt token is needed)"},
		{"mask", func(s *Sample) { s.LossMask = nil }, "sample 4 (line 9): loss_mask has 0 entries, want response_length 2"},
		{"nan reward", func(s *Sample) { s.Reward = math.NaN() }, "sample 4 (line 9): reward NaN is not finite"},
		{"negative token", func(s *Sample) { s.Tokens[0] = -1 }, "sample 4 (line 9): tokens[0]: -1 is negative"},
		{"logprobs", func(s *Sample) { s.RolloutLogProbs = []float32{0.5} },
			"sample 4 (line 9): rollout_log_probs has 1 entries, want response_length 2; rollout_log_probs[0]: 0.5 is not a finite value ≤ 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := good()
			tc.mutate(&s)
			err := s.Validate()
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	s, err := Toy(1, 64, 4, 1024, 7168, 151936)
	if err != nil {
		b.Fatal(err)
	}
	var buf strings.Builder
	if err := Encode(&buf, s); err != nil {
		b.Fatal(err)
	}
	in := buf.String()
	b.SetBytes(int64(len(in)))
	b.ResetTimer()
	for range b.N {
		if _, err := Decode("bench.jsonl", strings.NewReader(in)); err != nil {
			b.Fatal(err)
		}
	}
}
