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

// gateUpBackend is the CPU backend with a GateUpSwiGLU and a
// GateUpSwiGLUKeep that run their steps (gpu.GateUpSwiGLUSteps,
// gpu.GateUpSwiGLUKeepSteps: the unfused path's bits), or refuse (refuse)
// or fail (fail), counting their calls.
type gateUpBackend struct {
	gpu.Backend
	refuse, fail bool
	calls, keeps int
}

func (b *gateUpBackend) GateUpSwiGLU(act, x, gate, up gpu.Tensor) error {
	b.calls++
	if err := b.outcome(); err != nil {
		return err
	}
	return gpu.GateUpSwiGLUSteps(b.Backend, act, x, gate, up)
}

func (b *gateUpBackend) GateUpSwiGLUKeep(act, gOut, uOut, x, gate, up gpu.Tensor) error {
	b.keeps++
	if err := b.outcome(); err != nil {
		return err
	}
	return gpu.GateUpSwiGLUKeepSteps(b.Backend, act, gOut, uOut, x, gate, up)
}

// outcome is the fake's refusal or failure, or nil where it runs the steps.
func (b *gateUpBackend) outcome() error {
	switch {
	case b.refuse:
		return fmt.Errorf("test: %w", gpu.ErrNotFused)
	case b.fail:
		return errors.New("test: the fused kernel failed")
	}
	return nil
}

// paramGrads runs the model at dir forward and backward on b (bf16 compute,
// f32 grads) for p, with a fixed loss gradient and the layers'
// activations as mode says, and returns its parameters' gradients.
func paramGrads(t *testing.T, b gpu.Backend, dir string, p packed, mode actMode) map[string][]float32 {
	t.Helper()
	a := newTestArena(t, b, 24<<20)
	r := newRun(t, a, loadTestModel(t, a, dir), p, gpu.BF16, gpu.F32)
	logp, _ := r.forward(1)
	dl, de := make([]float32, len(logp)), make([]float32, len(logp))
	for i := range dl {
		dl[i], de[i] = -1/float32(len(dl)), 0.01
	}
	return r.params(r.backward(dl, de, mode))
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
		calls, keeps                 int
	}{
		{"transient, fused", false, true, false, cfg.NumLayers, 0},
		{"not transient, fused", false, false, false, 0, cfg.NumLayers},
		{"not transient, refused", true, false, false, 0, cfg.NumLayers},
		{"transient, refused", true, true, false, cfg.NumLayers, 0},
		{"transient, act in gate, fused", false, true, true, cfg.NumLayers, 0},
		{"transient, act in gate, refused", true, true, true, cfg.NumLayers, 0},
	} {
		b := &gateUpBackend{Backend: cpu.New(), refuse: c.refuse}
		got := forward(b, c.transient, c.actInGate)
		if b.calls != c.calls || b.keeps != c.keeps {
			t.Errorf("%s: %d GateUpSwiGLU and %d GateUpSwiGLUKeep calls, want %d and %d", c.name, b.calls, b.keeps, c.calls, c.keeps)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: log-probs differ from the unfused forward's", c.name)
		}
	}
	// A failing fused op fails the layer, transient or not.
	for _, transient := range []bool{true, false} {
		b := &gateUpBackend{Backend: cpu.New(), fail: true}
		a := newTestArena(t, b, 24<<20)
		m := loadTestModel(t, a, dir)
		r := newRun(t, a, m, p, gpu.BF16, gpu.F32)
		r.acts[0].Transient = transient
		err = m.c.LayerForward(b, r.layerWeights(0, r.gathered[1]), &r.acts[0], r.resid, r.resid, r.batch)
		if err == nil || errors.Is(err, gpu.ErrNotFused) {
			t.Errorf("a failing fused gate/up op (transient %v): layer forward error %v, want the kernel's", transient, err)
		}
	}
}

// A training forward that keeps the fused op's products gives the unfused
// path's gradients, bit for bit, from kept, rerun and lean activations
// (the fake backend's GateUpSwiGLUKeep runs the unfused steps, so this
// checks what the model does around it: which buffers it passes, and that
// the backward and a rerun read the products it kept).
func TestGateUpKeepBackward(t *testing.T) {
	dir := filepath.Join("testdata", "hf", "qwen2")
	g := loadGolden(t, dir)
	p := packSamples(g)
	grads := func(refuse bool, mode actMode) (*gateUpBackend, map[string][]float32) {
		b := &gateUpBackend{Backend: cpu.New(), refuse: refuse}
		return b, paramGrads(t, b, dir, p, mode)
	}
	cfg, err := LoadConfig(filepath.Join(dir, "model"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		mode  actMode
		keeps int
	}{
		{"kept", kept, cfg.NumLayers},
		{"recomputed", recomputed, 2 * cfg.NumLayers},
		{"lean", lean, cfg.NumLayers},
	} {
		_, want := grads(true, c.mode)
		b, got := grads(false, c.mode)
		if b.keeps != c.keeps {
			t.Errorf("%s: %d GateUpSwiGLUKeep calls, want %d", c.name, b.keeps, c.keeps)
		}
		for name, w := range want {
			if !slices.Equal(got[name], w) {
				t.Errorf("%s: grad %s differs from the unfused path's", c.name, name)
			}
		}
	}
}
