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

// TestGateUpSwiGLU holds the fused gate/up product with SwiGLU to the CPU's
// two products and SwiGLU, at row counts on and off the kernel's 128-row
// tiles, with reductions shorter and longer than its ring of buffers and
// more tiles than SMs (a CTA takes several), and to its own bits when run
// again; keeping the products (GateUpSwiGLUKeep), it holds them to the
// CPU's, act to the bits without them, and the unfused SwiGLU of them to
// act's bits. It skips where the kernel does not run (not Hopper).
func TestGateUpSwiGLU(t *testing.T) {
	e := newEnv(t)
	// N not a multiple of the kernel's 96-column tiles, down to 8.
	testGateUpSwiGLU(t, e, []gateUpShape{{128, 64, 128}, {300, 256, 384}, {1, 128, 256}, {200, 1024, 256},
		{2176, 320, 1024}, {300, 192, 200}, {130, 64, 8}})
}

// gateUpShape is a fused gate/up product's x [t,k] and weights [n,k].
type gateUpShape struct{ t, k, n int }

func testGateUpSwiGLU(t *testing.T, e *env, cases []gateUpShape) {
	defer func(on bool) { gateUpKeepOn = on }(gateUpKeepOn)
	gateUpKeepOn = true
	for _, dt := range []gpu.DType{gpu.BF16, gpu.F16} {
		for _, c := range cases {
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
			// Keeping the products: the same act, and products that the
			// unfused SwiGLU (k_swiglu8) turns into act's bits.
			kact, _ := e.out(dt, c.t, c.n)
			kg, _ := e.out(dt, c.t, c.n)
			ku, _ := e.out(dt, c.t, c.n)
			if err := e.g.GateUpSwiGLUKeep(kact, kg, ku, gx, gg, gu); err != nil {
				t.Fatalf("%s, keeping the products: %v", name, err)
			}
			e.sameBits(name+", act with the products kept against without", kact, gact)
			e.compare("gate/up swiglu keep, gate "+name, kg, cgate, tolFor(false, dt))
			e.compare("gate/up swiglu keep, up "+name, ku, cup, tolFor(false, dt))
			sw, _ := e.out(dt, c.t, c.n)
			if err := e.g.SwiGLU(sw, kg, ku); err != nil {
				t.Fatal(err)
			}
			e.sameBits(name+", SwiGLU of the kept products against act", sw, kact)
		}
	}
}

// TestGateUpSwiGLUSpecial holds the fused kernel's SwiGLU to k_swiglu8's
// bits on its own kept products where x holds infinities, NaNs and large
// values, so that its products do too: swiglu8's pairs rounded together
// meet them, and its vectors with a NaN take f2bf2's path (which gives
// the fast path's bits for canonical NaNs: this cannot tell them apart).
func TestGateUpSwiGLUSpecial(t *testing.T) {
	e := newEnv(t)
	defer func(on bool) { gateUpKeepOn = on }(gateUpKeepOn)
	gateUpKeepOn = true
	special := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1e30, -1e30, 300, -300}
	for _, dt := range []gpu.DType{gpu.BF16, gpu.F16} {
		c := gateUpShape{300, 256, 384}
		name := fmt.Sprintf("%v t%d k%d n%d", dt, c.t, c.k, c.n)
		e.off = 0
		gx, cx := e.alloc(dt, c.t, c.k)
		xv := e.randn(c.t*c.k, 1, dt)
		for i := 0; i < len(xv); i += 509 {
			xv[i] = gpu.Round(dt, special[e.r.IntN(len(special))])
		}
		e.set(gx, cx, xv)
		gg, _ := e.in(dt, 0.1, c.n, c.k)
		gu, _ := e.in(dt, 0.1, c.n, c.k)
		kact, _ := e.out(dt, c.t, c.n)
		kg, _ := e.out(dt, c.t, c.n)
		ku, _ := e.out(dt, c.t, c.n)
		err := e.g.GateUpSwiGLUKeep(kact, kg, ku, gx, gg, gu)
		if errors.Is(err, gpu.ErrNotFused) {
			t.Skipf("%s: %v", name, err)
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		sw, _ := e.out(dt, c.t, c.n)
		if err := e.g.SwiGLU(sw, kg, ku); err != nil {
			t.Fatal(err)
		}
		e.sameBits(name+", SwiGLU of the kept products against act", sw, kact)
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
	// RLPIPE_CUDA_GEMM_SWIGLU_KEEP=0 turns keeping the products off.
	defer func(on bool) { gateUpKeepOn = on }(gateUpKeepOn)
	gateUpKeepOn = false
	xb, _ := e.alloc(gpu.BF16, 4, 128)
	wb, _ := e.alloc(gpu.BF16, 128, 128)
	ab, _ := e.alloc(gpu.BF16, 4, 128)
	gb, _ := e.alloc(gpu.BF16, 4, 128)
	ub, _ := e.alloc(gpu.BF16, 4, 128)
	if err := e.g.GateUpSwiGLUKeep(ab, gb, ub, xb, wb, wb); !errors.Is(err, gpu.ErrNotFused) {
		t.Errorf("keep, switched off: got %v, want gpu.ErrNotFused", err)
	}
}

// BenchmarkGateUpSwiGLU times the MLP's gate/up product with SwiGLU at one
// model's shapes, with pseudo-random operands (scrambled, as BenchmarkOps'
// x): the unfused ops (two cuBLASLt products and SwiGLU),
// the products alone, and the fused kernel without and with the products
// kept (a training forward's). RLPIPE_BENCH_GATE_UP="T,K,N" picks
// the shapes (default Qwen2.5-3B's, 16384 tokens: "16384,2048,11008"):
//
//	go test -run '^$' -bench GateUpSwiGLU -benchtime 20x ./gpu/cuda
//
// A kernel this GPU does not run skips; without a driver it skips.
func BenchmarkGateUpSwiGLU(bb *testing.B) {
	b := backend(bb)
	T, K, N := 16384, 2048, 11008
	if d := os.Getenv("RLPIPE_BENCH_GATE_UP"); d != "" {
		if _, err := fmt.Sscanf(d, "%d,%d,%d", &T, &K, &N); err != nil {
			bb.Fatalf("RLPIPE_BENCH_GATE_UP=%q: want T,K,N: %v", d, err)
		}
	}
	mem, err := b.Alloc(int64(T*K+2*N*K+3*T*N)*2 + 8<<10)
	if err != nil {
		bb.Fatal(err)
	}
	defer b.Free(mem)
	var off int64
	ten := func(r, c int, scale float32) gpu.Tensor { return benchScrambled(bb, b, mem, &off, scale, r, c) }
	x, gate, up := ten(T, K, 1), ten(N, K, 0.05), ten(N, K, 0.05)
	g, u, act := ten(T, N, 0), ten(T, N, 0), ten(T, N, 0)
	flops := 2 * 2 * float64(T) * float64(K) * float64(N)
	shape := fmt.Sprintf("%dx%dx%d", T, N, K)
	for _, c := range []struct {
		name string
		f    func() error
	}{
		{"unfused " + shape, func() error {
			if err := b.Gemm(g, x, gate, false, true, 1, 0); err != nil {
				return err
			}
			if err := b.Gemm(u, x, up, false, true, 1, 0); err != nil {
				return err
			}
			return b.SwiGLU(act, g, u)
		}},
		{"products only " + shape, func() error {
			if err := b.Gemm(g, x, gate, false, true, 1, 0); err != nil {
				return err
			}
			return b.Gemm(u, x, up, false, true, 1, 0)
		}},
		{"fused " + shape, func() error { return b.GateUpSwiGLU(act, x, gate, up) }},
		{"fused, products kept " + shape, func() error {
			defer func(on bool) { gateUpKeepOn = on }(gateUpKeepOn)
			gateUpKeepOn = true
			return b.GateUpSwiGLUKeep(act, g, u, x, gate, up)
		}},
	} {
		timeOp(bb, b, c.name, flops, 0, c.f)
	}
}
