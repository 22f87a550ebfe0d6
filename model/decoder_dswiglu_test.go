package model

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
)

// downSwiGLUBackend is the CPU backend with a DownSwiGLUBackward that runs
// its steps (gpu.DownSwiGLUBackwardSteps: the product into a buffer of its
// own, then SwiGLUBackward from it, as the backward ran before it formed
// the product in dgate), or refuses (refuse) or fails (fail), counting its
// calls.
type downSwiGLUBackend struct {
	gpu.Backend
	refuse, fail bool
	calls        int
}

func (b *downSwiGLUBackend) DownSwiGLUBackward(dGate, dUp, dy, down, gate, up gpu.Tensor) error {
	b.calls++
	switch {
	case b.refuse:
		return fmt.Errorf("test: %w", gpu.ErrNotFused)
	case b.fail:
		return errors.New("test: the fused kernel failed")
	}
	return gpu.DownSwiGLUBackwardSteps(b.Backend, dGate, dUp, dy, down, gate, up)
}

// The backward takes the backend's DownSwiGLUBackward once per layer and
// gives the gradients of the steps it replaces, with the activations kept,
// recomputed or lean; a backend that refuses it gets the product in dgate
// and SwiGLU's backward in place, the same bits; a failing fused op fails
// the backward.
func TestDownSwiGLUBackward(t *testing.T) {
	dir := filepath.Join("testdata", "hf", "qwen2")
	g := loadGolden(t, dir)
	p := packSamples(g)
	cfg, err := LoadConfig(filepath.Join(dir, "model"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		mode actMode
	}{{"kept", kept}, {"recomputed", recomputed}, {"lean", lean}} {
		want := paramGrads(t, &downSwiGLUBackend{Backend: cpu.New()}, dir, p, c.mode)
		refusing := &downSwiGLUBackend{Backend: cpu.New(), refuse: true}
		got := paramGrads(t, refusing, dir, p, c.mode)
		if refusing.calls != cfg.NumLayers {
			t.Errorf("%s: %d DownSwiGLUBackward calls, want %d", c.name, refusing.calls, cfg.NumLayers)
		}
		for name, w := range want {
			if !slices.Equal(got[name], w) {
				t.Errorf("%s: grad %s of the unfused path differs from the fused op's", c.name, name)
			}
		}
	}
	b := &downSwiGLUBackend{Backend: cpu.New(), fail: true}
	a := newTestArena(t, b, 24<<20)
	r := newRun(t, a, loadTestModel(t, a, dir), p, gpu.BF16, gpu.F32)
	r.forward(1)
	c, l := r.m.c, cfg.NumLayers-1
	dw := r.layerWeights(l, a.tensor(r.gdt, int(LayoutElems(r.m.slots[l+1]))))
	dres := a.tensor(gpu.F32, r.batch.T, c.HiddenSize)
	if err := b.Zero(dres); err != nil {
		t.Fatal(err)
	}
	err = c.LayerBackward(b, r.layerWeights(l, r.gathered[l+1]), dw, &r.acts[l], &r.gb, r.inputs[l], dres, r.batch)
	if err == nil || !strings.Contains(err.Error(), "the fused kernel failed") {
		t.Errorf("a failing fused op: LayerBackward returned %v", err)
	}
}
