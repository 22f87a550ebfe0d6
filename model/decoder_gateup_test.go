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

// gateUpBackend is the CPU backend with a GateUpSwiGLU that runs its steps
// (gpu.GateUpSwiGLUSteps: the unfused path's bits), or refuses (refuse) or
// fails (fail), counting its calls.
type gateUpBackend struct {
	gpu.Backend
	refuse, fail bool
	calls        int
}

func (b *gateUpBackend) GateUpSwiGLU(act, x, gate, up gpu.Tensor) error {
	b.calls++
	switch {
	case b.refuse:
		return fmt.Errorf("test: %w", gpu.ErrNotFused)
	case b.fail:
		return errors.New("test: the fused kernel failed")
	}
	return gpu.GateUpSwiGLUSteps(b.Backend, act, x, gate, up)
}

// A forward marked Transient takes the backend's GateUpSwiGLU for every
// layer and gives the unfused forward's log-probs, with Act a buffer of its
// own or Gate's; one not marked, or a backend that refuses the operands,
// runs the products and SwiGLU (in place over Gate where Act is Gate); a
// failing fused op fails the forward.
func TestGateUpFused(t *testing.T) {
	dir := filepath.Join("testdata", "hf", "qwen2")
	g := loadGolden(t, dir)
	p := packSamples(g)
	// actInGate gives Act Gate's view, as the stages plan a transient
	// forward: the unfused path then runs SwiGLU in place.
	forward := func(b *gateUpBackend, transient, actInGate bool) []float32 {
		a := newTestArena(t, b, 24<<20)
		m := loadTestModel(t, a, dir)
		r := newRun(t, a, m, p, gpu.BF16, gpu.F32)
		for l := range r.acts {
			r.acts[l].Transient = transient
			if actInGate {
				r.acts[l].Act = r.acts[l].Gate
			}
		}
		logp, _ := r.forward(1)
		return logp
	}
	want := forward(&gateUpBackend{Backend: cpu.New(), refuse: true}, false, false)
	cfg, err := LoadConfig(filepath.Join(dir, "model"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name                         string
		refuse, transient, actInGate bool
		calls                        int
	}{
		{"transient, fused", false, true, false, cfg.NumLayers},
		{"not transient", false, false, false, 0},
		{"transient, refused", true, true, false, cfg.NumLayers},
		{"transient, act in gate, fused", false, true, true, cfg.NumLayers},
		{"transient, act in gate, refused", true, true, true, cfg.NumLayers},
	} {
		b := &gateUpBackend{Backend: cpu.New(), refuse: c.refuse}
		got := forward(b, c.transient, c.actInGate)
		if b.calls != c.calls {
			t.Errorf("%s: %d GateUpSwiGLU calls, want %d", c.name, b.calls, c.calls)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: log-probs differ from the unfused forward's", c.name)
		}
	}
	// A failing fused op fails the layer.
	b := &gateUpBackend{Backend: cpu.New(), fail: true}
	a := newTestArena(t, b, 24<<20)
	m := loadTestModel(t, a, dir)
	r := newRun(t, a, m, p, gpu.BF16, gpu.F32)
	r.acts[0].Transient = true
	err = m.c.LayerForward(b, r.layerWeights(0, r.gathered[1]), &r.acts[0], r.resid, r.resid, r.batch)
	if err == nil || errors.Is(err, gpu.ErrNotFused) {
		t.Errorf("a failing GateUpSwiGLU: layer forward error %v, want the kernel's", err)
	}
}
