package rollout

import (
	"reflect"
	"strings"
	"testing"
)

func TestDecodePrompts(t *testing.T) {
	in := "\xef\xbb\xbf" + `{"prompt_tokens":[1,2,3],"answer":"4","id":7}` + "\n\n" +
		`{"prompt_tokens":[]}` + "\n" +
		`{"answer":1}` + "\n" +
		`{"prompt_tokens":[5],"meta":{"a":[1,true]}}` + "\n" +
		`{"prompt_tokens":[-1]}` + "\n"
	got, err := DecodePrompts("p.jsonl", strings.NewReader(in))
	want := []Prompt{
		{Tokens: []int32{1, 2, 3}, Labels: map[string]any{"answer": "4", "id": float64(7)}, Index: 0, Line: 1},
		{Tokens: []int32{5}, Labels: map[string]any{"meta": map[string]any{"a": []any{float64(1), true}}}, Index: 1, Line: 5},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("prompts %+v\nwant %+v", got, want)
	}
	wantErr := "p.jsonl:3: prompt_tokens is empty\np.jsonl:4: missing prompt_tokens\np.jsonl:6: prompt_tokens[0]: -1 is negative"
	if err == nil || err.Error() != wantErr {
		t.Errorf("error:\n%v\nwant:\n%s", err, wantErr)
	}
	if _, err := DecodePrompts("e.jsonl", strings.NewReader("\n")); err == nil || err.Error() != "e.jsonl: no prompts" {
		t.Errorf("empty file: %v", err)
	}
}

// TestRand checks that draws depend on the seed and every key, lie in
// [0, 1), and average about 1/2.
func TestRand(t *testing.T) {
	a, b := NewRand(1, 2, 3).Float64(), NewRand(1, 2, 3).Float64()
	if a != b {
		t.Errorf("equal seeds and keys gave %v and %v", a, b)
	}
	for _, other := range []*Rand{NewRand(2, 2, 3), NewRand(1, 3, 3), NewRand(1, 2, 4), NewRand(1, 2)} {
		if other.Float64() == a {
			t.Error("another seed or key gave the same draw")
		}
	}
	r := NewRand(9)
	var sum float64
	for range 100000 {
		x := r.Float64()
		if x < 0 || x >= 1 {
			t.Fatalf("draw %v outside [0, 1)", x)
		}
		sum += x
	}
	if m := sum / 100000; m < 0.495 || m > 0.505 {
		t.Errorf("mean of 100000 draws %v, want about 0.5", m)
	}
}
