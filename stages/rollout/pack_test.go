package rollout

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// handSamples are the three samples of the hand-worked packing example in
// docs/data.md; token id 0 appears in prompts and responses.
func handSamples() []Sample {
	return []Sample{
		{Tokens: []int32{5, 6, 7, 8}, ResponseLength: 2, Reward: 1, LossMask: []float32{1, 1}, Group: 0},
		{Tokens: []int32{0, 9, 0}, ResponseLength: 1, Reward: 0, LossMask: []float32{1}, Group: 0, Index: 1},
		{Tokens: []int32{3, 0, 0, 4, 2}, ResponseLength: 3, Reward: 0.5, LossMask: []float32{1, 0, 1}, Group: 1, Index: 2},
	}
}

func TestPackHandWorked(t *testing.T) {
	p, err := Pack(handSamples(), []int{0, 1, 2})
	if err != nil {
		t.Fatal(err)
	}
	want := &Packed{
		Tokens:      []int32{5, 6, 7, 8, 0, 9, 0, 3, 0, 0, 4, 2},
		Positions:   []int32{0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4},
		CuSeqlens:   []int32{0, 4, 7, 12},
		MaxSeqlen:   5,
		LogitPos:    []int32{1, 2, 5, 8, 9, 10},
		Targets:     []int32{7, 8, 0, 0, 4, 2},
		Mask:        []float32{1, 1, 1, 1, 0, 1},
		RespStart:   []int{0, 2, 3, 6},
		SampleIndex: []int{0, 1, 2},
		Rewards:     []float64{1, 0, 0.5},
	}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("got  %+v\nwant %+v", p, want)
	}
	// The rule of RL-MATH: sample j's logit positions are
	// [end_j − 1 − R_j, end_j − 1), and each target is the next token.
	for j := range p.NumSamples() {
		end := int(p.CuSeqlens[j+1])
		r := p.RespStart[j+1] - p.RespStart[j]
		for k := p.RespStart[j]; k < p.RespStart[j+1]; k++ {
			if lp := int(p.LogitPos[k]); lp != end-1-r+(k-p.RespStart[j]) || p.Tokens[lp+1] != p.Targets[k] {
				t.Errorf("sample %d response token %d: logit position %d", j, k, lp)
			}
		}
	}
	if p.NumTokens() != 12 {
		t.Errorf("NumTokens = %d", p.NumTokens())
	}
}

func TestPackOrderAndLogProbs(t *testing.T) {
	s := handSamples()
	for i := range s {
		s[i].RolloutLogProbs = make([]float32, s[i].ResponseLength)
		for k := range s[i].RolloutLogProbs {
			s[i].RolloutLogProbs[k] = -float32(10*i + k)
		}
	}
	p, err := Pack(s, []int{2, 0})
	if err != nil {
		t.Fatal(err)
	}
	if want := []int32{3, 0, 0, 4, 2, 5, 6, 7, 8}; !reflect.DeepEqual(p.Tokens, want) {
		t.Errorf("tokens %v, want %v", p.Tokens, want)
	}
	if want := []int32{1, 2, 3, 6, 7}; !reflect.DeepEqual(p.LogitPos, want) {
		t.Errorf("logit positions %v, want %v", p.LogitPos, want)
	}
	if want := []float32{-20, -21, -22, 0, -1}; !reflect.DeepEqual(p.RolloutLogProbs, want) {
		t.Errorf("rollout log-probs %v, want %v", p.RolloutLogProbs, want)
	}
	if want := []int{2, 0}; !reflect.DeepEqual(p.SampleIndex, want) {
		t.Errorf("sample index %v, want %v", p.SampleIndex, want)
	}
	per, err := p.Unpack(p.RolloutLogProbs)
	if err != nil {
		t.Fatal(err)
	}
	if want := [][]float32{{-20, -21, -22}, {0, -1}}; !reflect.DeepEqual(per, want) {
		t.Errorf("unpack %v, want %v", per, want)
	}
	if _, err := p.Unpack(make([]float32, 4)); err == nil {
		t.Error("unpack of the wrong length accepted")
	}
}

// TestTokenZeroIsNotPadding checks that sequences ending in, starting with and
// made mostly of token 0 keep every token through decode and packing.
func TestTokenZeroIsNotPadding(t *testing.T) {
	in := `{"prompt_tokens":[0,0],"response_tokens":[0,0,0],"reward":1,"group":0}
{"tokens":[0,7,0,0],"response_length":3,"reward":0,"group_index":0,"loss_mask":[0,1,1]}
`
	s, err := Decode("zeros.jsonl", strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	p, err := Pack(s, []int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	if want := []int32{0, 0, 0, 0, 0, 0, 7, 0, 0}; !reflect.DeepEqual(p.Tokens, want) {
		t.Errorf("tokens %v, want %v", p.Tokens, want)
	}
	if want := []int32{0, 5, 9}; !reflect.DeepEqual(p.CuSeqlens, want) {
		t.Errorf("cu_seqlens %v, want %v", p.CuSeqlens, want)
	}
	if want := []int32{1, 2, 3, 5, 6, 7}; !reflect.DeepEqual(p.LogitPos, want) {
		t.Errorf("logit positions %v, want %v", p.LogitPos, want)
	}
	if want := []int32{0, 0, 0, 7, 0, 0}; !reflect.DeepEqual(p.Targets, want) {
		t.Errorf("targets %v, want %v", p.Targets, want)
	}
	if want := []float32{1, 1, 1, 0, 1, 1}; !reflect.DeepEqual(p.Mask, want) {
		t.Errorf("mask %v, want %v", p.Mask, want)
	}
}

func TestPackErrors(t *testing.T) {
	s := handSamples()
	s[1].RolloutLogProbs = []float32{-1}
	bad := handSamples()
	bad[0].ResponseLength = 4
	tests := []struct {
		name    string
		samples []Sample
		idx     []int
		want    string
	}{
		{"out of range", handSamples(), []int{0, 3}, "sample 3 is out of range (3 samples)"},
		{"negative", handSamples(), []int{-1}, "sample -1 is out of range (3 samples)"},
		{"twice", handSamples(), []int{1, 1}, "sample 1 is listed twice"},
		{"mixed log-probs", s, []int{0, 1}, "1 of 2 samples have rollout_log_probs: give them for all or none"},
		{"invalid sample", bad, []int{0}, "sample 0: response_length 4 must be less than the 4 tokens (at least one prompt token is needed); loss_mask has 2 entries, want response_length 4"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Pack(tc.samples, tc.idx)
			if err == nil || err.Error() != tc.want {
				t.Errorf("got %v, %v; want error %q", p, err, tc.want)
			}
		})
	}
	p, err := Pack(handSamples(), nil)
	if err != nil || p.NumSamples() != 0 || !reflect.DeepEqual(p.CuSeqlens, []int32{0}) || !reflect.DeepEqual(p.RespStart, []int{0}) {
		t.Errorf("empty pack: %+v, %v", p, err)
	}
}

func TestGroups(t *testing.T) {
	mk := func(groups ...int) []Sample {
		s := make([]Sample, len(groups))
		for i, g := range groups {
			s[i] = Sample{Group: g, Index: i, Line: i + 1}
		}
		return s
	}
	tests := []struct {
		name    string
		samples []Sample
		n       int
		want    [][]int
		wantErr string
	}{
		{"consecutive", mk(3, 3, 1, 1), 2, [][]int{{0, 1}, {2, 3}}, ""},
		{"interleaved", mk(0, 1, 0, 1), 2, [][]int{{0, 2}, {1, 3}}, ""},
		{"unchecked sizes", mk(5, 5, 5, 2), 0, [][]int{{0, 1, 2}, {3}}, ""},
		{"empty", nil, 4, nil, ""},
		{"wrong sizes", mk(5, 5, 5, 2), 2, nil,
			"line 1: group 5 (first sample 0) has 3 samples, want samples_per_prompt 2\nline 4: group 2 (first sample 3) has 1 samples, want samples_per_prompt 2"},
		{"negative n", mk(1), -1, nil, "samples per prompt must not be negative, got -1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Groups(tc.samples, tc.n)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCheckVocab(t *testing.T) {
	s := handSamples()
	s[2].Line = 7
	if err := CheckVocab(s, 10); err != nil {
		t.Errorf("vocab 10: %v", err)
	}
	err := CheckVocab(s, 8)
	if err == nil || err.Error() != "sample 0: tokens[3]: 8 is outside the vocabulary of 8\nsample 1: tokens[1]: 9 is outside the vocabulary of 8" {
		t.Errorf("vocab 8: %v", err)
	}
	if err := CheckVocab(s, 0); err == nil {
		t.Error("vocab 0 accepted")
	}
}

func TestToy(t *testing.T) {
	a, err := Toy(7, 4, 3, 5, 6, 32)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Toy(7, 4, 3, 5, 6, 32)
	if !reflect.DeepEqual(a, b) {
		t.Error("Toy is not deterministic")
	}
	c, _ := Toy(8, 4, 3, 5, 6, 32)
	if reflect.DeepEqual(a, c) {
		t.Error("different seeds give the same samples")
	}
	if len(a) != 12 {
		t.Fatalf("%d samples, want 12", len(a))
	}
	groups, err := Groups(a, 3)
	if err != nil || len(groups) != 4 {
		t.Fatalf("groups %v, %v", groups, err)
	}
	minR, maxR := math.Inf(1), math.Inf(-1)
	for i := range a {
		s := &a[i]
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		if s.Index != i || len(s.Tokens) != 11 || s.ResponseLength != 6 || s.Group != i/3 {
			t.Errorf("sample %d: %+v", i, s)
		}
		if g := &a[i/3*3]; !reflect.DeepEqual(s.Tokens[:5], g.Tokens[:5]) {
			t.Errorf("sample %d does not share its group's prompt", i)
		}
		if s.Reward != ToyReward(s.Response(), 32) || s.Reward < 0 || s.Reward > 1 {
			t.Errorf("sample %d: reward %v", i, s.Reward)
		}
		minR, maxR = min(minR, s.Reward), max(maxR, s.Reward)
	}
	if minR == maxR {
		t.Errorf("all rewards equal %v", minR)
	}
	if err := CheckVocab(a, 32); err != nil {
		t.Error(err)
	}
	for _, args := range [][5]int{{0, 1, 1, 1, 4}, {1, 1, 0, 1, 4}, {1, 1, 1, 1, 3}} {
		if _, err := Toy(1, args[0], args[1], args[2], args[3], args[4]); err == nil {
			t.Errorf("Toy%v accepted", args)
		}
	}
	if got := ToyReward([]int32{0, 7, 8, 31}, 32); got != 0.5 {
		t.Errorf("ToyReward = %v, want 0.5", got)
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	s, err := Toy(3, 3, 2, 4, 5, 1000)
	if err != nil {
		t.Fatal(err)
	}
	s[1].LossMask[2] = 0
	s[4].LossMask[0] = 0.25
	for i := range s {
		s[i].RolloutLogProbs = []float32{-0.1, -1.0 / 3, -2.5e-7, 0, -17.75}
	}
	s[2].Reward = 1.0 / 3
	path := filepath.Join(t.TempDir(), "toy.jsonl")
	if err := Write(path, s); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range s {
		s[i].Line = i + 1
	}
	if !reflect.DeepEqual(got, s) {
		t.Errorf("round trip differs:\ngot  %+v\nwant %+v", got, s)
	}

	bad := []Sample{{Tokens: []int32{1}, ResponseLength: 1, LossMask: []float32{1}}}
	dir := t.TempDir()
	if err := Write(filepath.Join(dir, "bad.jsonl"), bad); err == nil {
		t.Error("invalid sample written")
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("failed write left %v behind", left)
	}
	if err := Write(filepath.Join(t.TempDir(), "missing", "x.jsonl"), s); err == nil {
		t.Error("write into a missing directory succeeded")
	}
}
