package model

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
)

// gemmAddBackend is the CPU backend with a GemmAdd that copies c to d and
// runs the product with beta 1 (one rounding of the sum, as cuBLASLt's
// epilogue), or refuses (refuse) or fails (fail), counting its calls.
type gemmAddBackend struct {
	gpu.Backend
	refuse, fail bool
	calls        int
}

func (b *gemmAddBackend) GemmAdd(d, c, a, w gpu.Tensor, transA, transB bool) error {
	b.calls++
	switch {
	case b.refuse:
		return fmt.Errorf("test: %w", gpu.ErrNotFused)
	case b.fail:
		return errors.New("test: the product failed")
	}
	if !gpu.SameView(d, c) {
		if err := b.Copy(d, c); err != nil {
			return err
		}
	}
	return b.Gemm(d, a, w, transA, transB, 1, 1)
}

// A backend with GemmAdd takes it for every layer's down projection and
// residual add, in transient forwards and others alike, and the log-probs
// stay within bf16's rounding of the two-op forward's; a backend that
// refuses the operands runs the product and the add (the same bits as a
// backend without GemmAdd); a failing GemmAdd fails the forward.
func TestGemmAddForward(t *testing.T) {
	dir := filepath.Join("testdata", "hf", "qwen2")
	g := loadGolden(t, dir)
	p := packSamples(g)
	forward := func(b gpu.Backend, transient bool) []float32 {
		a := newTestArena(t, b, 24<<20)
		m := loadTestModel(t, a, dir)
		r := newRun(t, a, m, p, gpu.BF16, gpu.F32)
		for l := range r.acts {
			r.acts[l].Transient = transient
		}
		logp, _ := r.forward(1)
		return logp
	}
	want := forward(cpu.New(), false)
	cfg, err := LoadConfig(filepath.Join(dir, "model"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name              string
		refuse, transient bool
		same              bool // the same bits as the two-op forward
	}{
		{"fused", false, false, false},
		{"transient, fused", false, true, false},
		{"refused", true, false, true},
	} {
		b := &gemmAddBackend{Backend: cpu.New(), refuse: c.refuse}
		got := forward(b, c.transient)
		if b.calls != cfg.NumLayers {
			t.Errorf("%s: %d GemmAdd calls, want %d", c.name, b.calls, cfg.NumLayers)
		}
		if c.same {
			if !slices.Equal(got, want) {
				t.Errorf("%s: log-probs differ from the two-op forward's", c.name)
			}
			continue
		}
		var worst float64
		for i := range got {
			worst = math.Max(worst, math.Abs(float64(got[i]-want[i])))
		}
		// One rounding of the residual sum instead of two moves the
		// log-probs by bf16's rounding, carried through the layers.
		if worst > 0.05 || math.IsNaN(worst) {
			t.Errorf("%s: log-probs up to %.3g from the two-op forward's, want within 0.05", c.name, worst)
		}
		t.Logf("%s: log-probs within %.3g of the two-op forward's", c.name, worst)
	}
	b := &gemmAddBackend{Backend: cpu.New(), fail: true}
	a := newTestArena(t, b, 24<<20)
	m := loadTestModel(t, a, dir)
	r := newRun(t, a, m, p, gpu.BF16, gpu.F32)
	err = m.c.LayerForward(b, r.layerWeights(0, r.gathered[1]), &r.acts[0], r.resid, r.resid, r.batch)
	if err == nil || errors.Is(err, gpu.ErrNotFused) {
		t.Errorf("a failing GemmAdd: layer forward error %v, want the product's", err)
	}
}
