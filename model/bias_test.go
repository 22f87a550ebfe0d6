package model

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
)

// TestLayerWeightsBiases checks which projection biases LayerWeightsFrom
// returns for each HF golden case: q/k/v biases for qwen2 and llama_bias,
// an o_proj bias [H] for llama_bias only.
func TestLayerWeightsBiases(t *testing.T) {
	tests := []struct {
		fam       string
		qkv, oOut bool
	}{
		{"llama", false, false},
		{"qwen2", true, false},
		{"qwen3", false, false},
		{"mistral", false, false},
		{"llama_bias", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.fam, func(t *testing.T) {
			b := cpu.New()
			a := newTestArena(t, b, 4<<20)
			m := loadTestModel(t, a, filepath.Join("testdata", "hf", tt.fam))
			for l := range m.c.NumLayers {
				w, err := m.c.LayerWeightsFrom(m.units[l+1], m.slots[l+1], m.master[l+1])
				if err != nil {
					t.Fatal(err)
				}
				if got := w.QBias.Mem != nil && w.KBias.Mem != nil && w.VBias.Mem != nil; got != tt.qkv {
					t.Errorf("layer %d: q/k/v biases present = %v, want %v", l, got, tt.qkv)
				}
				if got := w.OBias.Mem != nil; got != tt.oOut {
					t.Fatalf("layer %d: o_proj bias present = %v, want %v", l, got, tt.oOut)
				}
				if tt.oOut && !gpu.SameShape(w.OBias.Shape, []int{m.c.HiddenSize}) {
					t.Errorf("layer %d: o_proj bias shape %v, want [%d]", l, w.OBias.Shape, m.c.HiddenSize)
				}
			}
		})
	}
}

// TestOutputBiasRequired checks that a layer whose config has an o_proj
// bias refuses to run without it, or with a misshapen one, forward and
// backward (weights and gradients alike).
func TestOutputBiasRequired(t *testing.T) {
	dir := filepath.Join("testdata", "hf", "llama_bias")
	b := cpu.New()
	a := newTestArena(t, b, 8<<20)
	m := loadTestModel(t, a, dir)
	g := loadGolden(t, dir)
	r := newRun(t, a, m, packSamples(g), gpu.F32, gpu.F32)
	c := m.c
	w := r.layerWeights(0, r.gathered[1])
	grad := a.tensor(gpu.F32, int(LayoutElems(m.slots[1])))
	if err := b.Zero(grad); err != nil {
		t.Fatal(err)
	}
	dw := r.layerWeights(0, grad)
	in := r.inputs[0]
	dres := a.tensor(gpu.F32, r.batch.T, c.HiddenSize)
	if err := b.Zero(dres); err != nil {
		t.Fatal(err)
	}
	if err := c.LayerForward(b, w, &r.acts[0], in, r.resid, r.batch); err != nil {
		t.Fatalf("valid forward: %v", err)
	}
	if err := c.LayerBackward(b, w, dw, &r.acts[0], &r.gb, in, dres, r.batch); err != nil {
		t.Fatalf("valid backward: %v", err)
	}
	noBias, short := w, w
	noBias.OBias = gpu.Tensor{}
	var err error
	if short.OBias, err = w.OBias.Flat(0, c.HiddenSize/2); err != nil {
		t.Fatal(err)
	}
	noGrad := dw
	noGrad.OBias = gpu.Tensor{}
	tests := []struct {
		name string
		run  func() error
	}{
		{"forward without bias", func() error { return c.LayerForward(b, noBias, &r.acts[0], in, r.resid, r.batch) }},
		{"forward with short bias", func() error { return c.LayerForward(b, short, &r.acts[0], in, r.resid, r.batch) }},
		{"recompute without bias", func() error { return c.LayerForward(b, noBias, &r.rc, in, gpu.Tensor{}, r.batch) }},
		{"backward without bias", func() error {
			return c.LayerBackward(b, noBias, dw, &r.acts[0], &r.gb, in, dres, r.batch)
		}},
		{"backward without bias gradient", func() error {
			return c.LayerBackward(b, w, noGrad, &r.acts[0], &r.gb, in, dres, r.batch)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if err == nil || !strings.Contains(err.Error(), "o_proj bias") {
				t.Errorf("error %v, want one about the o_proj bias", err)
			}
		})
	}
}
