package cpu

import (
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// The spans ops' arithmetic is checked against whole-sequence attention
// by model's TestRingAttention; here, their argument checks.
func TestAttentionSpansErrors(t *testing.T) {
	b := New()
	ten := func(dt gpu.DType, shape ...int) gpu.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		m, err := b.Alloc(int64(n * dt.Size()))
		if err != nil {
			t.Fatal(err)
		}
		x, err := gpu.NewTensor(m, 0, dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	q, k, v := ten(gpu.F32, 6, 2, 4), ten(gpu.F32, 4, 1, 4), ten(gpu.F32, 4, 1, 4)
	out, lse := ten(gpu.F32, 6, 2, 4), ten(gpu.F32, 2, 6)
	tests := []struct {
		name  string
		spans []gpu.Span
		want  string
	}{
		{"query rows out of range", []gpu.Span{{Q: 4, QLen: 3, K: 0, KLen: 4}}, "outside 6 query and 4 key rows"},
		{"key rows out of range", []gpu.Span{{Q: 0, QLen: 2, K: 3, KLen: 2}}, "outside"},
		{"query rows shared", []gpu.Span{{Q: 0, QLen: 3, K: 0, KLen: 2}, {Q: 2, QLen: 2, K: 2, KLen: 2}}, "overlap at query row 2"},
		{"key rows shared", []gpu.Span{{Q: 0, QLen: 3, K: 0, KLen: 2}, {Q: 3, QLen: 3, K: 1, KLen: 2}}, "overlap at key row 1"},
	}
	for _, tc := range tests {
		err := b.AttentionSpans(out, lse, q, k, v, tc.spans, 0.5)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
	sp := []gpu.Span{{Q: 0, QLen: 6, K: 0, KLen: 4}}
	if err := b.AttentionSpans(ten(gpu.F32, 6, 2, 8), lse, q, k, v, sp, 0.5); err == nil || !strings.Contains(err.Error(), "out has shape [6 2 8]") {
		t.Errorf("wrong out shape: %v", err)
	}
	if err := b.AttentionSpans(out, lse, q, ten(gpu.F32, 4, 3, 4), ten(gpu.F32, 4, 3, 4), sp, 0.5); err == nil {
		t.Error("3 kv heads for 2 query heads accepted")
	}
	if err := b.MergeAttention(out, lse, ten(gpu.F32, 5, 2, 4), lse); err == nil {
		t.Error("merge of different shapes accepted")
	}
}
