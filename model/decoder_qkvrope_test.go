package model

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
)

// qkvRoPEBackend is the CPU backend with a QKVRoPE that runs the product
// into scratch and QKVSplit (the unfused ops' bits), then scales v by
// scaleV; or refuses (refuse) or fails (fail). It counts its
// calls.
type qkvRoPEBackend struct {
	gpu.Backend
	refuse, fail bool
	scaleV       float32
	calls        int
}

func (b *qkvRoPEBackend) QKVRoPE(q, k, v, x, w, bias, pos, scratch gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) error {
	b.calls++
	switch {
	case b.refuse:
		return fmt.Errorf("test: %w", gpu.ErrNotFused)
	case b.fail:
		return errors.New("test: the product failed")
	}
	if err := b.Gemm(scratch, x, w, false, true, 1, 0); err != nil {
		return err
	}
	if err := b.QKVSplit(q, k, v, scratch, bias, pos, theta, scaling); err != nil {
		return err
	}
	if b.scaleV != 1 {
		return b.Scale(v, b.scaleV)
	}
	return nil
}

// A backend with QKVRoPE takes it for every layer's fused q, k and v
// projection, and the forward uses what it writes: with the unfused op's
// values the log-probs keep their bits, with v scaled they move; a backend
// that refuses the operands runs the product and QKVSplit; a failing
// QKVRoPE fails the forward.
func TestQKVRoPEForward(t *testing.T) {
	dir := filepath.Join("testdata", "hf", "qwen2")
	g := loadGolden(t, dir)
	p := packSamples(g)
	// run is the model at dp 1 (its q, k and v weights adjacent) with the
	// fused projection's scratch in every layer.
	run := func(b gpu.Backend) *run {
		a := newTestArena(t, b, 24<<20)
		m := loadTestModelDP(t, a, dir, 1)
		if !m.c.FusedQKV(m.slots[1]) {
			t.Fatal("the qwen2 model does not fuse its q, k and v projections at dp 1")
		}
		r := newRun(t, a, m, p, gpu.BF16, gpu.F32)
		c := m.c
		for l := range r.acts {
			r.acts[l].QKV = a.tensor(gpu.BF16, r.batch.T, (c.NumHeads+2*c.NumKVHeads)*c.HeadDim)
		}
		return r
	}
	forward := func(b gpu.Backend) []float32 {
		logp, _ := run(b).forward(1)
		return logp
	}
	want := forward(cpu.New())
	cfg, err := LoadConfig(filepath.Join(dir, "model"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		refuse bool
		scaleV float32
		same   bool
	}{
		{"fused", false, 1, true},
		{"fused, v scaled", false, 1.01, false},
		{"refused", true, 1, true},
	} {
		b := &qkvRoPEBackend{Backend: cpu.New(), refuse: c.refuse, scaleV: c.scaleV}
		got := forward(b)
		if b.calls != cfg.NumLayers {
			t.Errorf("%s: %d QKVRoPE calls, want %d", c.name, b.calls, cfg.NumLayers)
		}
		if slices.Equal(got, want) != c.same {
			t.Errorf("%s: log-probs equal to the unfused forward's: %v, want %v", c.name, !c.same, c.same)
		}
	}
	b := &qkvRoPEBackend{Backend: cpu.New(), fail: true}
	r := run(b)
	err = r.m.c.LayerForward(b, r.layerWeights(0, r.gathered[1]), &r.acts[0], r.resid, r.resid, r.batch)
	if err == nil || errors.Is(err, gpu.ErrNotFused) {
		t.Errorf("a failing QKVRoPE: layer forward error %v, want the product's", err)
	}
}
