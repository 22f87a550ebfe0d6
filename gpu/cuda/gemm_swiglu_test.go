//go:build cgo

package cuda

import (
	"errors"
	"fmt"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// TestGateUpSwiGLU holds the fused gate/up product with SwiGLU to the CPU's
// two products and SwiGLU, at row counts on and off the kernel's 128-row
// tiles, with reductions shorter and longer than its ring of buffers and
// more tiles than SMs (a CTA takes several), and to its own bits when run
// again. It skips where the kernel does not run (not Hopper).
func TestGateUpSwiGLU(t *testing.T) {
	e := newEnv(t)
	for _, dt := range []gpu.DType{gpu.BF16, gpu.F16} {
		for _, c := range []struct{ t, k, n int }{{128, 64, 128}, {300, 256, 384}, {1, 128, 256}, {200, 1024, 256}, {2176, 320, 1024}} {
			name := fmt.Sprintf("%v t%d k%d n%d", dt, c.t, c.k, c.n)
			e.off = 0
			gx, cx := e.in(dt, 1, c.t, c.k)
			gg, cg := e.in(dt, 0.1, c.n, c.k)
			gu, cu := e.in(dt, 0.1, c.n, c.k)
			gact, cact := e.out(dt, c.t, c.n)
			_, cgate := e.alloc(dt, c.t, c.n)
			_, cup := e.alloc(dt, c.t, c.n)
			err := e.g.GateUpSwiGLU(gact, gx, gg, gu)
			if errors.Is(err, gpu.ErrNotFused) {
				t.Skipf("%s: %v", name, err)
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if err := e.c.Gemm(cgate, cx, cg, false, true, 1, 0); err != nil {
				t.Fatal(err)
			}
			if err := e.c.Gemm(cup, cx, cu, false, true, 1, 0); err != nil {
				t.Fatal(err)
			}
			if err := e.c.SwiGLU(cact, cgate, cup); err != nil {
				t.Fatal(err)
			}
			e.compare("gate/up swiglu "+name, gact, cact, tolFor(false, dt))
			again, _ := e.alloc(dt, c.t, c.n)
			if err := e.g.GateUpSwiGLU(again, gx, gg, gu); err != nil {
				t.Fatalf("%s, again: %v", name, err)
			}
			e.sameBits(name+", a second run against the first", again, gact)
		}
	}
}

// A shape or dtype the kernel does not take is refused with
// gpu.ErrNotFused (or, on a GPU without wgmma, every call is).
func TestGateUpSwiGLURefuses(t *testing.T) {
	e := newEnv(t)
	x, _ := e.alloc(gpu.BF16, 4, 96)
	w, _ := e.alloc(gpu.BF16, 128, 96)
	a, _ := e.alloc(gpu.BF16, 4, 128)
	if err := e.g.GateUpSwiGLU(a, x, w, w); !errors.Is(err, gpu.ErrNotFused) {
		t.Errorf("K 96: got %v, want gpu.ErrNotFused", err)
	}
	xf, _ := e.alloc(gpu.F32, 4, 128)
	wf, _ := e.alloc(gpu.F32, 128, 128)
	af, _ := e.alloc(gpu.F32, 4, 128)
	if err := e.g.GateUpSwiGLU(af, xf, wf, wf); !errors.Is(err, gpu.ErrNotFused) {
		t.Errorf("f32: got %v, want gpu.ErrNotFused", err)
	}
}
