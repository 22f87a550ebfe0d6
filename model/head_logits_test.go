package model

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
)

// TestHeadLogits checks the sampling head against the log-prob head: for
// every row, log_softmax(logits/T) at the target equals HeadForward's
// log-prob, computed in two chunks.
func TestHeadLogits(t *testing.T) {
	const n, h, v, temp = 5, 16, 40, 0.7
	b := cpu.New()
	a := newTestArena(t, b, 1<<20)
	r := rand.New(rand.NewPCG(1, 2))
	rnd := func(k int, scale float64) []float32 {
		x := make([]float32, k)
		for i := range x {
			x[i] = float32(r.NormFloat64() * scale)
		}
		return x
	}
	c := &Config{RMSNormEps: 1e-6, VocabSize: v, HiddenSize: h}
	norm := rnd(h, 0.1)
	for i := range norm {
		norm[i]++
	}
	w := HeadWeights{Norm: a.f32(norm), LMHead: a.f32(rnd(v*h, 0.5))}
	w.LMHead.Shape = []int{v, h}
	rowsData := rnd(n*h, 1)
	rows := a.f32(rowsData)
	rows.Shape = []int{n, h}
	xn, rstd := a.tensor(gpu.F32, n, h), a.tensor(gpu.F32, n)
	logits := a.tensor(gpu.F32, 3, v)
	got := make([]float32, 0, n*v)
	for lo := 0; lo < n; lo += 3 {
		hi := min(lo+3, n)
		if err := c.HeadLogits(b, w, rows, xn, rstd, logits, lo, hi); err != nil {
			t.Fatal(err)
		}
		got = append(got, a.down(logits)[:(hi-lo)*v]...)
	}
	targets := []int32{0, 7, 39, 12, 3}
	logp, ent := a.tensor(gpu.F32, n), a.tensor(gpu.F32, n)
	rows2 := a.f32(rowsData)
	rows2.Shape = []int{n, h}
	if err := c.HeadForward(b, w, rows2, a.tensor(gpu.F32, n, h), a.tensor(gpu.F32, n), a.i32(targets), logp, ent, a.tensor(gpu.F32, 3, v), 3, Sampling{Temperature: temp}); err != nil {
		t.Fatal(err)
	}
	want := a.down(logp)
	for i := range n {
		row := got[i*v : (i+1)*v]
		m := math.Inf(-1)
		for _, z := range row {
			m = math.Max(m, float64(z)/temp)
		}
		var s float64
		for _, z := range row {
			s += math.Exp(float64(z)/temp - m)
		}
		lp := float64(row[targets[i]])/temp - m - math.Log(s)
		if d := math.Abs(lp - float64(want[i])); d > 1e-5 {
			t.Errorf("row %d: log_softmax(logits/T)[target] %v, the log-prob head %v", i, lp, want[i])
		}
	}
}

func TestEOSTokenIDs(t *testing.T) {
	for _, tt := range []struct {
		raw  string
		want []int
	}{
		{`{"eos_token_id": 151643}`, []int{151643}},
		{`{"eos_token_id": [1, 2]}`, []int{1, 2}},
		{`{"eos_token_id": null}`, nil},
		{`{}`, nil},
	} {
		c := &Config{Raw: []byte(tt.raw)}
		got := c.EOSTokenIDs()
		if len(got) != len(tt.want) || (len(got) > 0 && got[0] != tt.want[0]) {
			t.Errorf("%s: EOSTokenIDs() = %v, want %v", tt.raw, got, tt.want)
		}
	}
}
