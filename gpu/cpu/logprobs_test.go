package cpu

import (
	"math"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// lpRef computes log-probs and entropies in float64.
func lpRef(h, w []float64, targets []int32, hd, v int, temp float64, tempered bool) (lp, ent []float64) {
	c := len(targets)
	lp, ent = make([]float64, c), make([]float64, c)
	for r := range c {
		l := make([]float64, v)
		for j := range v {
			l[j] = dot64(h[r*hd:(r+1)*hd], w[j*hd:(j+1)*hd])
		}
		lse := func(s float64) float64 {
			m := math.Inf(-1)
			for _, x := range l {
				m = math.Max(m, x*s)
			}
			z := 0.0
			for _, x := range l {
				z += math.Exp(x*s - m)
			}
			return m + math.Log(z)
		}
		lp[r] = l[targets[r]]/temp - lse(1/temp)
		s := 1.0
		if tempered {
			s = 1 / temp
		}
		ls := lse(s)
		for _, x := range l {
			p := math.Exp(x*s - ls)
			ent[r] -= p * (x*s - ls)
		}
	}
	return lp, ent
}

func TestLogProbs(t *testing.T) {
	const c, hd, v = 5, 8, 37
	tests := []struct {
		name     string
		temp     float32
		tempered bool
		hdt      gpu.DType
		entropy  bool
	}{
		{"t1", 1, false, f32, true},
		{"t0.7 untempered entropy", 0.7, false, f32, true},
		{"t0.7 tempered entropy", 0.7, true, f32, true},
		{"bf16 no entropy", 1.3, false, bf16, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			r := rng()
			hv, wv := randn(r, c*hd, 1, tc.hdt), randn(r, v*hd, 0.5, tc.hdt)
			targets := []int32{0, 36, 5, 5, 17}
			h, w, tg := e.up(tc.hdt, hv, c, hd), e.up(tc.hdt, wv, v, hd), e.ids(targets)
			lp, logits := e.tensor(f32, c), e.tensor(f32, c, v)
			var ent gpu.Tensor
			if tc.entropy {
				ent = e.tensor(f32, c)
			}
			if err := e.b.LogProbs(lp, ent, h, w, tg, tc.temp, tc.tempered, logits, gpu.Tensor{}); err != nil {
				t.Fatal(err)
			}
			h64, w64 := f64(hv), f64(wv)
			wantLP, wantEnt := lpRef(h64, w64, targets, hd, v, float64(tc.temp), tc.tempered)
			closeTo(t, "logp", e.down(lp), wantLP, 1e-5, 1e-5)
			if tc.entropy {
				closeTo(t, "entropy", e.down(ent), wantEnt, 1e-5, 1e-5)
			}

			// Backward: L = Σ a·logp + b·entropy, checked by finite
			// differences of the float64 reference.
			av, bv := randn(r, c, 1, f32), randn(r, c, 1, f32)
			a64, b64 := f64(av), f64(bv)
			var dent gpu.Tensor
			if tc.entropy {
				dent = e.up(f32, bv, c)
			}
			dh, dw := e.tensor(tc.hdt, c, hd), e.tensor(f32, v, hd)
			if err := e.b.Fill(dw, 0.25); err != nil {
				t.Fatal(err)
			}
			if err := e.b.LogProbsBackward(dh, dw, e.up(f32, av, c), dent, h, w, tg, tc.temp, tc.tempered, logits); err != nil {
				t.Fatal(err)
			}
			loss := func() float64 {
				lp, ent := lpRef(h64, w64, targets, hd, v, float64(tc.temp), tc.tempered)
				s := dot64(a64, lp)
				if tc.entropy {
					s += dot64(b64, ent)
				}
				return s
			}
			gh := numGrad(h64, 1e-6, func([]float64) float64 { return loss() })
			gw := numGrad(w64, 1e-6, func([]float64) float64 { return loss() })
			for i := range gw {
				gw[i] += 0.25
			}
			rtol := 1e-4
			if tc.hdt == bf16 {
				rtol = 1.0 / 64
			}
			closeTo(t, "dh", e.down(dh), gh, 1e-5, rtol)
			closeTo(t, "dw", e.down(dw), gw, 1e-5, 1e-4)
		})
	}
}

func TestLogProbsErrors(t *testing.T) {
	e := newEnv(t)
	const c, hd, v = 3, 4, 6
	h, w, tg := e.tensor(f32, c, hd), e.tensor(f32, v, hd), e.ids([]int32{0, 1, 2})
	lp, logits := e.tensor(f32, c), e.tensor(f32, c, v)
	tests := []struct {
		name                      string
		lp, ent, h, w, tg, logits gpu.Tensor
		temp                      float32
	}{
		{"target range", lp, gpu.Tensor{}, h, w, e.ids([]int32{0, 6, 1}), logits, 1},
		{"temperature", lp, gpu.Tensor{}, h, w, tg, logits, 0},
		{"logits dtype", lp, gpu.Tensor{}, h, w, tg, e.tensor(bf16, c, v), 1},
		{"logits shape", lp, gpu.Tensor{}, h, w, tg, e.tensor(f32, c, v+1), 1},
		{"w width", lp, gpu.Tensor{}, h, e.tensor(f32, v, hd+1), tg, logits, 1},
		{"entropy shape", lp, e.tensor(f32, c+1), h, w, tg, logits, 1},
		{"logp dtype", e.tensor(bf16, c), gpu.Tensor{}, h, w, tg, logits, 1},
		{"logits aliases h", lp, gpu.Tensor{}, h, w, tg, gpu.Tensor{Mem: h.Mem, Off: h.Off, DType: f32, Shape: []int{c, v}}, 1},
	}
	for _, tc := range tests {
		if err := e.b.LogProbs(tc.lp, tc.ent, tc.h, tc.w, tc.tg, tc.temp, false, tc.logits, gpu.Tensor{}); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	if err := e.b.LogProbsBackward(e.tensor(f32, c, hd+1), gpu.Tensor{}, lp, gpu.Tensor{}, h, w, tg, 1, false, logits); err == nil {
		t.Error("backward: dh shape mismatch accepted")
	}
	// dw may be skipped.
	if err := e.b.LogProbsBackward(e.tensor(f32, c, hd), gpu.Tensor{}, lp, gpu.Tensor{}, h, w, tg, 1, false, logits); err != nil {
		t.Errorf("backward without dw: %v", err)
	}
}
