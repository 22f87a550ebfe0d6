//go:build cgo

package cuda

import (
	"errors"
	"fmt"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// TestGemmAdd holds GemmAdd (d = c + x·wᵀ, rounded once) to the CPU's
// product with beta 1, which also rounds the sum once, into a separate d
// and in place (d is c), and checks that a separate d leaves c as it was.
func TestGemmAdd(t *testing.T) {
	e := newEnv(t)
	for _, dt := range []gpu.DType{gpu.BF16, gpu.F16, gpu.F32} {
		for _, c := range []struct{ t, k, n int }{{128, 64, 128}, {300, 256, 200}, {1, 96, 40}, {1030, 512, 384}} {
			for _, inPlace := range []bool{false, true} {
				name := fmt.Sprintf("%v t%d k%d n%d in place %v", dt, c.t, c.k, c.n, inPlace)
				e.off = 0
				gx, cx := e.in(dt, 1, c.t, c.k)
				gw, cw := e.in(dt, 0.1, c.n, c.k)
				gres, cres := e.in(dt, 1, c.t, c.n)
				resVals := make([]float32, gres.Numel())
				if err := e.g.Download(resVals, gres); err != nil {
					t.Fatal(err)
				}
				gd := gres
				if !inPlace {
					gd, _ = e.out(dt, c.t, c.n)
				}
				err := e.g.GemmAdd(gd, gres, gx, gw, false, true)
				if errors.Is(err, gpu.ErrNotFused) {
					t.Fatalf("%s: refused: %v", name, err)
				}
				e.check(name, err, e.c.Gemm(cres, cx, cw, false, true, 1, 1))
				e.compare("gemm add "+name, gd, cres, tolFor(false, dt))
				if !inPlace {
					after := make([]float32, gres.Numel())
					if err := e.g.Download(after, gres); err != nil {
						t.Fatal(err)
					}
					for i := range after {
						if after[i] != resVals[i] {
							t.Fatalf("%s: c[%d] changed from %v to %v", name, i, resVals[i], after[i])
						}
					}
				}
			}
		}
	}
}

// GemmAdd refuses operands cuBLASLt does not combine with gpu.ErrNotFused,
// and a c of another shape or dtype, or partly overlapping d, outright.
func TestGemmAddRefuses(t *testing.T) {
	e := newEnv(t)
	xf, _ := e.alloc(gpu.F32, 4, 64)
	w, _ := e.alloc(gpu.BF16, 32, 64)
	d, _ := e.alloc(gpu.BF16, 4, 32)
	c, _ := e.alloc(gpu.BF16, 4, 32)
	if err := e.g.GemmAdd(d, c, xf, w, false, true); !errors.Is(err, gpu.ErrNotFused) {
		t.Errorf("f32 x with bf16 w: got %v, want gpu.ErrNotFused", err)
	}
	x, _ := e.alloc(gpu.BF16, 4, 64)
	c16, _ := e.alloc(gpu.F16, 4, 32)
	cWide, _ := e.alloc(gpu.BF16, 4, 33)
	big, _ := e.alloc(gpu.BF16, 8, 32)
	half, err := gpu.NewTensor(big.Mem, big.Off+2*32*2, gpu.BF16, 4, 32)
	if err != nil {
		t.Fatal(err)
	}
	full, err := gpu.NewTensor(big.Mem, big.Off, gpu.BF16, 4, 32)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		c, d gpu.Tensor
	}{{"c f16", c16, d}, {"c 4x33", cWide, d}, {"c partly over d", half, full}} {
		err := e.g.GemmAdd(tc.d, tc.c, x, w, false, true)
		if err == nil || errors.Is(err, gpu.ErrNotFused) {
			t.Errorf("%s: got %v, want an error that is not gpu.ErrNotFused", tc.name, err)
		}
	}
}
