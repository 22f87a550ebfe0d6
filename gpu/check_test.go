package gpu

import (
	"strings"
	"testing"
)

// fakeMem is Memory for views in these checks; nothing is read or written.
type fakeMem struct{ n int64 }

func (m fakeMem) Size() int64 { return m.n }

func view(t *testing.T, mem Memory, off int64, dt DType, shape ...int) Tensor {
	t.Helper()
	x, err := NewTensor(mem, off, dt, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func TestGemmDims(t *testing.T) {
	m1, m2 := &fakeMem{1 << 20}, &fakeMem{1 << 20}
	tests := []struct {
		name           string
		c, a, b        Tensor
		transA, transB bool
		m, n, k        int
		err            string
	}{
		{"plain", view(t, m1, 0, F32, 2, 3), view(t, m2, 0, F32, 2, 4), view(t, m2, 4096, F32, 4, 3), false, false, 2, 3, 4, ""},
		{"linear (b transposed)", view(t, m1, 0, F32, 2, 3), view(t, m2, 0, BF16, 2, 4), view(t, m2, 4096, BF16, 3, 4), false, true, 2, 3, 4, ""},
		{"a transposed", view(t, m1, 0, F32, 4, 3), view(t, m2, 0, F32, 2, 4), view(t, m2, 4096, F32, 2, 3), true, false, 4, 3, 2, ""},
		{"inner mismatch", view(t, m1, 0, F32, 2, 3), view(t, m2, 0, F32, 2, 4), view(t, m2, 4096, F32, 5, 3), false, false, 0, 0, 0, "inner dimensions differ"},
		{"c shape", view(t, m1, 0, F32, 3, 3), view(t, m2, 0, F32, 2, 4), view(t, m2, 4096, F32, 4, 3), false, false, 0, 0, 0, "c has shape [3 3], want [2 3]"},
		{"c overlaps a", view(t, m2, 16, F32, 2, 3), view(t, m2, 0, F32, 2, 4), view(t, m2, 4096, F32, 4, 3), false, false, 0, 0, 0, "c must not overlap a"},
		{"a missing", view(t, m1, 0, F32, 2, 3), Tensor{}, view(t, m2, 4096, F32, 4, 3), false, false, 0, 0, 0, "a is missing"},
		{"b not 2-D", view(t, m1, 0, F32, 2, 3), view(t, m2, 0, F32, 2, 4), view(t, m2, 4096, F32, 12), false, false, 0, 0, 0, "b must have 2 dimensions"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, n, k, err := GemmDims(tt.c, tt.a, tt.b, tt.transA, tt.transB)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || m != tt.m || n != tt.n || k != tt.k {
				t.Fatalf("GemmDims = %d, %d, %d, %v; want %d, %d, %d", m, n, k, err, tt.m, tt.n, tt.k)
			}
		})
	}
}

func TestLogProbsDims(t *testing.T) {
	mem, ws := &fakeMem{1 << 20}, &fakeMem{1 << 20}
	h := view(t, mem, 0, BF16, 4, 8)
	w := view(t, mem, 1024, BF16, 16, 8)
	tg := view(t, mem, 4096, I32, 4)
	ent := view(t, mem, 8192, F32, 4)
	logits := view(t, ws, 0, F32, 4, 16)
	c, hd, v, hasEnt, err := LogProbsDims("logprobs", ent, h, w, tg, 0.7, logits)
	if err != nil || c != 4 || hd != 8 || v != 16 || !hasEnt {
		t.Fatalf("LogProbsDims = %d, %d, %d, %v, %v", c, hd, v, hasEnt, err)
	}
	if _, _, _, hasEnt, err := LogProbsDims("logprobs", Tensor{}, h, w, tg, 1, logits); err != nil || hasEnt {
		t.Errorf("without entropy: %v, %v", hasEnt, err)
	}
	bad := []struct {
		name        string
		w, logits   Tensor
		temperature float32
		err         string
	}{
		{"zero temperature", w, logits, 0, "temperature 0 must be positive"},
		{"w width", view(t, mem, 1024, BF16, 16, 4), logits, 1, "w has shape [16 4], want [16 8]"},
		{"logits over w", w, view(t, mem, 1024, F32, 4, 16), 1, "logits must not overlap w"},
	}
	for _, tt := range bad {
		if _, _, _, _, err := LogProbsDims("logprobs", ent, h, tt.w, tg, tt.temperature, tt.logits); err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%s: error %v, want %q", tt.name, err, tt.err)
		}
	}
}

func TestAlias(t *testing.T) {
	mem := &fakeMem{1 << 20}
	x := view(t, mem, 0, F32, 8)
	if err := CheckAlias("op", "out", "in", x, x); err != nil {
		t.Errorf("the same view is in place, not an alias: %v", err)
	}
	if err := CheckAlias("op", "out", "in", view(t, mem, 4, F32, 8), x); err == nil {
		t.Error("a partial overlap was accepted")
	}
	if err := CheckNoAlias("op", "out", "in", x, x); err == nil {
		t.Error("CheckNoAlias accepted the same view")
	}
	if err := CheckNoAlias("op", "out", "in", view(t, mem, 32, F32, 8), x); err != nil {
		t.Errorf("adjacent views do not overlap: %v", err)
	}
}
