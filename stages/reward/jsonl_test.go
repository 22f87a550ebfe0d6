package reward

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestParseReward(t *testing.T) {
	tests := []struct {
		line string
		want float64
		err  string // substring of the error; "" for success
	}{
		{"1", 1, ""},
		{"-0.5", -0.5, ""},
		{" 2e-3 \r", 0.002, ""},
		{`{"reward": 3}`, 3, ""},
		{`{"detail": [1, 2], "reward": -1.25}`, -1.25, ""},
		{"", 0, "empty line"},
		{"abc", 0, "is not a number"},
		{`"1"`, 0, "is not a number"},
		{"true", 0, "is not a number"},
		{"NaN", 0, "is not a number"},
		{"Infinity", 0, "is not a number"},
		{"0x10", 0, "is not a number"},
		{"1 2", 0, "is not a number"},
		{"1e999", 0, "non-finite"},
		{`{"score": 1}`, 0, `has no "reward" field`},
		{`{"reward": "1"}`, 0, "is not a number"},
		{`{"reward": null}`, 0, "is not a number"},
		{`{"reward": 1`, 0, "invalid JSON"},
	}
	for _, tt := range tests {
		got, err := parseReward([]byte(tt.line))
		switch {
		case tt.err == "" && err != nil:
			t.Errorf("parseReward(%q): %v", tt.line, err)
		case tt.err == "" && got != tt.want:
			t.Errorf("parseReward(%q) = %v, want %v", tt.line, got, tt.want)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("parseReward(%q) error %v, want one containing %q", tt.line, err, tt.err)
		}
	}
}

func TestReadRewards(t *testing.T) {
	tests := []struct {
		name string
		in   string
		n    int
		want []float64
		line int // line of a *LineError; 0: none
		cnt  int // Lines of a *CountError; -1: none
	}{
		{"final newline", "1\n2\n", 2, []float64{1, 2}, 0, -1},
		{"no final newline", "1\n2", 2, []float64{1, 2}, 0, -1},
		{"crlf", "1\r\n{\"reward\":2}\r\n", 2, []float64{1, 2}, 0, -1},
		{"blank line inside", "1\n\n2\n", 3, nil, 2, -1},
		{"trailing blank line", "1\n2\n\n", 2, nil, 0, 3},
		{"too few", "1\n", 2, nil, 0, 1},
		{"nothing", "", 1, nil, 0, 0},
		{"too long", "1\n" + strings.Repeat("1", maxLineBytes+1) + "\n", 2, nil, 2, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readRewards(strings.NewReader(tt.in), tt.n)
			var le *LineError
			var ce *CountError
			switch {
			case tt.line > 0:
				if !errors.As(err, &le) || le.Line != tt.line {
					t.Fatalf("error %v, want a *LineError at line %d", err, tt.line)
				}
			case tt.cnt >= 0:
				if !errors.As(err, &ce) || ce.Lines != tt.cnt || ce.Samples != tt.n {
					t.Fatalf("error %v, want a *CountError of %d lines", err, tt.cnt)
				}
			case err != nil:
				t.Fatalf("readRewards: %v", err)
			case !equalFloats(got, tt.want):
				t.Fatalf("readRewards = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestEncodeBatch(t *testing.T) {
	samples := []Sample{
		{Index: 4, Group: 2, Prompt: []int32{1, 2}, Response: []int32{3}, Finish: "stop", Labels: map[string]any{"answer": "<b>&"}},
		{Index: 5, Group: 2, Finish: "length"},
	}
	b, err := encodeBatch(samples)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"index":4,"group":2,"prompt_tokens":[1,2],"response_tokens":[3],"finish":"stop","label":{"answer":"<b>&"}}` + "\n" +
		`{"index":5,"group":2,"prompt_tokens":[],"response_tokens":[],"finish":"length","label":{}}` + "\n"
	if string(b) != want {
		t.Fatalf("encodeBatch =\n%s\nwant\n%s", b, want)
	}
	var v map[string]any
	if err := json.Unmarshal(b[:strings.IndexByte(string(b), '\n')], &v); err != nil {
		t.Fatal(err)
	}
	if _, err := encodeBatch([]Sample{{Index: 9, Labels: map[string]any{"bad": func() {}}}}); err == nil || !strings.Contains(err.Error(), "sample 9") {
		t.Fatalf("encoding an unencodable label: error %v, want one naming sample 9", err)
	}
}

func TestTailBuffer(t *testing.T) {
	tests := []struct {
		writes []string
		want   string
	}{
		{[]string{"ab", "cd"}, "abcd"},
		{[]string{"abc", "def", "gh"}, "...defgh"},
		{[]string{"abcdefghij"}, "...fghij"},
		{[]string{"  x \n"}, "x"},
	}
	for _, tt := range tests {
		tb := &tailBuffer{max: 5}
		for _, w := range tt.writes {
			tb.Write([]byte(w))
		}
		if got := tb.String(); got != tt.want {
			t.Errorf("tail of %q = %q, want %q", tt.writes, got, tt.want)
		}
	}
}
