//go:build cgo

package cuda

import (
	"errors"
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// TestDownSwiGLUBackward holds the down projection's input gradient with
// SwiGLU's backward in one kernel to the CPU's product (rounded to the
// dtype) and SwiGLUBackward, and to the GPU's unfused ops, at row counts on
// and off the kernel's 128-row tiles, N on and off its 192-column tiles
// (down to 8), reductions shorter and longer than its ring of buffers and
// more tiles than SMs; and to its own bits when run again. It skips where
// the kernel does not run (not Hopper).
func TestDownSwiGLUBackward(t *testing.T) {
	e := newEnv(t)
	for _, dt := range []gpu.DType{gpu.BF16, gpu.F16} {
		for _, c := range []struct{ t, k, n int }{{128, 64, 192}, {300, 256, 384}, {1, 128, 256}, {200, 1024, 200},
			{4224, 128, 1152}, {130, 64, 8}, {257, 320, 520}} {
			name := fmt.Sprintf("%v t%d k%d n%d", dt, c.t, c.k, c.n)
			e.off = 0
			gy, cy := e.in(dt, 1, c.t, c.k)
			gw, cw := e.in(dt, 0.1, c.k, c.n)
			gg, cg := e.in(dt, 1, c.t, c.n)
			gu, cu := e.in(dt, 1, c.t, c.n)
			gdg, cdg := e.out(dt, c.t, c.n)
			gdu, cdu := e.out(dt, c.t, c.n)
			err := e.g.DownSwiGLUBackward(gdg, gdu, gy, gw, gg, gu)
			if errors.Is(err, gpu.ErrNotFused) {
				t.Skipf("%s: %v", name, err)
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			// The CPU's product rounded to the dtype in cdg, then SwiGLU's
			// backward in place.
			if err := e.c.Gemm(cdg, cy, cw, false, false, 1, 0); err != nil {
				t.Fatal(err)
			}
			if err := e.c.SwiGLUBackward(cdg, cdu, cdg, cg, cu); err != nil {
				t.Fatal(err)
			}
			e.compare("down swiglu backward, dgate "+name, gdg, cdg, tolFor(false, dt))
			e.compare("down swiglu backward, dup "+name, gdu, cdu, tolFor(false, dt))
			// The GPU's unfused ops: cuBLASLt's product, then k_swiglu_bwd8.
			udg, _ := e.out(dt, c.t, c.n)
			udu, _ := e.out(dt, c.t, c.n)
			if err := e.g.Gemm(udg, gy, gw, false, false, 1, 0); err != nil {
				t.Fatal(err)
			}
			if err := e.g.SwiGLUBackward(udg, udu, udg, gg, gu); err != nil {
				t.Fatal(err)
			}
			e.compareGPU("down swiglu backward against the unfused ops, dgate "+name, gdg, udg, tolFor(false, dt))
			e.compareGPU("down swiglu backward against the unfused ops, dup "+name, gdu, udu, tolFor(false, dt))
			adg, _ := e.out(dt, c.t, c.n)
			adu, _ := e.out(dt, c.t, c.n)
			if err := e.g.DownSwiGLUBackward(adg, adu, gy, gw, gg, gu); err != nil {
				t.Fatalf("%s, again: %v", name, err)
			}
			e.sameBits(name+", dgate of a second run against the first", adg, gdg)
			e.sameBits(name+", dup of a second run against the first", adu, gdu)
		}
	}
}

// TestDownSwiGLUBackwardBits holds the fused kernel to the unfused ops
// (cuBLASLt's product, then k_swiglu_bwd8) bit for bit where the product
// is exact in any order (dy in {-1, 0, 1}, the weights in sixteenths of
// -2..2), with infinities, NaNs, zeros of both signs and large values
// among the gate and up values and dy: dswiglu8's pairs rounded together
// meet overflow and infinities, and its vectors with a NaN take f2bf2's
// path (whose NaNs are the fast path's bits where the hardware's NaNs
// are canonical, so this cannot tell which path ran for them).
func TestDownSwiGLUBackwardBits(t *testing.T) {
	e := newEnv(t)
	special := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 0, float32(math.Copysign(0, -1)),
		1e30, -1e30, 100, -100, 88, -88, 87, -87, 1e-30, -1e-30}
	for _, dt := range []gpu.DType{gpu.BF16, gpu.F16} {
		for _, c := range []struct{ t, k, n int }{{300, 256, 384}, {130, 64, 8}, {257, 320, 520}} {
			name := fmt.Sprintf("%v t%d k%d n%d", dt, c.t, c.k, c.n)
			e.off = 0
			ints := func(n int, lo, hi int, scale float32) []float32 {
				v := make([]float32, n)
				for i := range v {
					v[i] = float32(lo+e.r.IntN(hi-lo+1)) * scale
				}
				return v
			}
			withSpecial := func(v []float32, every int, special []float32) []float32 {
				for i := 0; i < len(v); i += every {
					v[i] = gpu.Round(dt, special[e.r.IntN(len(special))])
				}
				return v
			}
			// At most one of these a row of dy (k < 997), so that each
			// product stays exact whatever the order of its sums.
			gy, cy := e.alloc(dt, c.t, c.k)
			e.set(gy, cy, withSpecial(ints(c.t*c.k, -1, 1, 1), 997, special[:7]))
			gw, cw := e.alloc(dt, c.k, c.n)
			e.set(gw, cw, ints(c.k*c.n, -2, 2, 1.0/16))
			gg, cg := e.alloc(dt, c.t, c.n)
			e.set(gg, cg, withSpecial(e.randn(c.t*c.n, 4, dt), 7, special))
			gu, cu := e.alloc(dt, c.t, c.n)
			e.set(gu, cu, withSpecial(e.randn(c.t*c.n, 4, dt), 11, special))
			gdg, _ := e.out(dt, c.t, c.n)
			gdu, _ := e.out(dt, c.t, c.n)
			err := e.g.DownSwiGLUBackward(gdg, gdu, gy, gw, gg, gu)
			if errors.Is(err, gpu.ErrNotFused) {
				t.Skipf("%s: %v", name, err)
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			udg, _ := e.out(dt, c.t, c.n)
			udu, _ := e.out(dt, c.t, c.n)
			if err := e.g.Gemm(udg, gy, gw, false, false, 1, 0); err != nil {
				t.Fatal(err)
			}
			if err := e.g.SwiGLUBackward(udg, udu, udg, gg, gu); err != nil {
				t.Fatal(err)
			}
			e.sameBits(name+", dgate against the unfused ops", gdg, udg)
			e.sameBits(name+", dup against the unfused ops", gdu, udu)
		}
	}
}

// A dtype or shape the kernel does not take, or the switch off, is refused
// with gpu.ErrNotFused; operands that do not fit are an error.
func TestDownSwiGLUBackwardRefuses(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		name     string
		dt       gpu.DType
		k, n     int
		off      bool
		notFused bool
	}{
		{"f32", gpu.F32, 128, 64, false, true},
		{"k not a multiple of 64", gpu.BF16, 96, 64, false, true},
		{"n not a multiple of 8", gpu.BF16, 128, 60, false, true},
		{"switched off", gpu.BF16, 128, 64, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func(off bool) { downSwiGLUOff = off }(downSwiGLUOff)
			downSwiGLUOff = c.off
			e.off = 0
			y, _ := e.alloc(c.dt, 4, c.k)
			w, _ := e.alloc(c.dt, c.k, c.n)
			g, _ := e.alloc(c.dt, 4, c.n)
			u, _ := e.alloc(c.dt, 4, c.n)
			dg, _ := e.alloc(c.dt, 4, c.n)
			du, _ := e.alloc(c.dt, 4, c.n)
			err := e.g.DownSwiGLUBackward(dg, du, y, w, g, u)
			if got := errors.Is(err, gpu.ErrNotFused); got != c.notFused || err == nil {
				t.Errorf("got %v, want an error wrapping gpu.ErrNotFused: %v", err, c.notFused)
			}
		})
	}
	// dUp on dy: an error, not a refusal.
	e.off = 0
	y, _ := e.alloc(gpu.BF16, 4, 128)
	w, _ := e.alloc(gpu.BF16, 128, 64)
	g, _ := e.alloc(gpu.BF16, 4, 64)
	u, _ := e.alloc(gpu.BF16, 4, 64)
	dg, _ := e.alloc(gpu.BF16, 4, 64)
	du, err := gpu.NewTensor(y.Mem, y.Off, gpu.BF16, 4, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.g.DownSwiGLUBackward(dg, du, y, w, g, u); err == nil || errors.Is(err, gpu.ErrNotFused) {
		t.Errorf("dUp on dy: got %v, want an overlap error", err)
	}
}

// compareGPU downloads two GPU tensors and checks the relative error of a
// against b.
func (e *env) compareGPU(name string, a, b gpu.Tensor, tol float64) {
	e.t.Helper()
	got, want := make([]float32, a.Numel()), make([]float32, b.Numel())
	if err := e.g.Download(got, a); err != nil {
		e.t.Fatalf("%s: download: %v", name, err)
	}
	if err := e.g.Download(want, b); err != nil {
		e.t.Fatalf("%s: download: %v", name, err)
	}
	e.compareVals(name, got, want, tol)
}

// BenchmarkDownSwiGLUBackward times the down projection's input gradient
// with SwiGLU's backward at one model's shapes, with pseudo-random operands
// (scrambled): the unfused ops (cuBLASLt's product, then SwiGLUBackward),
// the product alone, and the fused kernel. RLPIPE_BENCH_DOWN="T,H,I" picks
// the shapes (default Qwen2.5-3B's, 16384 tokens: "16384,2048,11008"):
//
//	go test -run '^$' -bench DownSwiGLUBackward -benchtime 20x ./gpu/cuda
//
// A kernel this GPU does not run skips; without a driver it skips.
func BenchmarkDownSwiGLUBackward(bb *testing.B) {
	b := backend(bb)
	T, H, I := 16384, 2048, 11008
	if d := os.Getenv("RLPIPE_BENCH_DOWN"); d != "" {
		if _, err := fmt.Sscanf(d, "%d,%d,%d", &T, &H, &I); err != nil {
			bb.Fatalf("RLPIPE_BENCH_DOWN=%q: want T,H,I: %v", d, err)
		}
	}
	mem, err := b.Alloc(int64(T*H+H*I+5*T*I)*2 + 8<<10)
	if err != nil {
		bb.Fatal(err)
	}
	defer b.Free(mem)
	var off int64
	ten := func(r, c int, scale float32) gpu.Tensor { return benchScrambled(bb, b, mem, &off, scale, r, c) }
	dy, down := ten(T, H, 1), ten(H, I, 0.05)
	gate, up := ten(T, I, 1), ten(T, I, 1)
	dact, dg, du := ten(T, I, 0), ten(T, I, 0), ten(T, I, 0)
	flops := 2 * float64(T) * float64(H) * float64(I)
	shape := fmt.Sprintf("%dx%dx%d", T, I, H)
	for _, c := range []struct {
		name string
		f    func() error
	}{
		{"unfused " + shape, func() error {
			if err := b.Gemm(dact, dy, down, false, false, 1, 0); err != nil {
				return err
			}
			return b.SwiGLUBackward(dg, du, dact, gate, up)
		}},
		{"product only " + shape, func() error { return b.Gemm(dact, dy, down, false, false, 1, 0) }},
		{"fused " + shape, func() error { return b.DownSwiGLUBackward(dg, du, dy, down, gate, up) }},
	} {
		timeOp(bb, b, c.name, flops, 0, c.f)
	}
}
