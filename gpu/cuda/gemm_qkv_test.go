//go:build cgo

package cuda

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// qkvRoPEShape is a QKVRoPE call's x [t,k] and heads.
type qkvRoPEShape struct {
	t, k, hq, hkv, d int
	bias             bool
	sc               *gpu.RoPEScaling
}

// TestQKVRoPE holds the fused projection with its bias and RoPE to the
// GPU's product and QKVSplit, bit for bit where the product is exact
// (small integers: every accumulation order gives the same sums, so only
// the epilogue is tested), and within the 16-bit tolerance of the CPU's
// steps for normal values; at row counts on and off the 128-row tiles,
// head counts that leave a part of the last 256-column tile empty,
// reductions shorter and longer than the ring, more tiles than SMs, with
// and without biases and with llama3's RoPE scaling; and to its own bits
// when run again. It skips where the kernel does not run (not Hopper).
func TestQKVRoPE(t *testing.T) {
	e := newEnv(t)
	llama3 := &gpu.RoPEScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}
	cases := []qkvRoPEShape{
		{300, 256, 16, 2, 128, true, nil},    // 3B's heads: 10 tiles of 2 heads
		{2176, 128, 12, 2, 128, true, nil},   // 1.5B's: 17 × 8 tiles, more than SMs
		{130, 320, 14, 2, 64, true, nil},     // 0.5B's: 18 heads of 64, the last tile half empty
		{1, 64, 3, 1, 64, false, llama3},     // one row, one tile, 5 heads of 64
		{257, 192, 4, 2, 128, false, llama3}, // 8 heads of 128: 4 tiles
	}
	hc := hostColumns{e.g}
	for _, dt := range []gpu.DType{gpu.BF16, gpu.F16} {
		for _, c := range cases {
			for _, exact := range []bool{true, false} {
				e.off = 0
				name := fmt.Sprintf("%v t%d k%d %d/%d heads of %d bias %v exact %v", dt, c.t, c.k, c.hq, c.hkv, c.d, c.bias, exact)
				n := (c.hq + 2*c.hkv) * c.d
				gp, cp := e.ids(e.randIDs(c.t, 20000))
				var gx, cx, gw, cw, gb, cb gpu.Tensor
				if exact {
					gx, cx = e.alloc(dt, c.t, c.k)
					gw, cw = e.alloc(dt, n, c.k)
					e.set(gx, cx, e.smallInts(c.t*c.k, 2))
					e.set(gw, cw, e.smallInts(n*c.k, 2))
				} else {
					gx, cx = e.in(dt, 1, c.t, c.k)
					gw, cw = e.in(dt, 0.1, n, c.k)
				}
				if c.bias {
					gb, cb = e.in(dt, 1, n)
				}
				gq, cq := e.out(dt, c.t, c.hq, c.d)
				gk, ck := e.out(dt, c.t, c.hkv, c.d)
				gv, cv := e.out(dt, c.t, c.hkv, c.d)
				scratch, _ := e.out(dt, c.t, n)
				err := e.g.QKVRoPE(gq, gk, gv, gx, gw, gb, gp, scratch, 1e6, c.sc)
				if errors.Is(err, gpu.ErrNotFused) {
					t.Skipf("%s: %v", name, err)
				}
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				outs := [3][2]gpu.Tensor{{gq, cq}, {gk, ck}, {gv, cv}}
				if exact {
					// The GPU's steps: cuBLASLt's product, then QKVSplit.
					gqkv, _ := e.alloc(dt, c.t, n)
					var s [3]gpu.Tensor
					for i, o := range outs {
						s[i], _ = e.alloc(dt, o[0].Shape...)
					}
					if err := e.g.Gemm(gqkv, gx, gw, false, true, 1, 0); err != nil {
						t.Fatal(err)
					}
					if err := gpu.QKVSplitSteps(e.g, hc, s[0], s[1], s[2], gqkv, gb, gp, 1e6, c.sc); err != nil {
						t.Fatal(err)
					}
					for i, what := range []string{"q", "k", "v"} {
						e.sameBits(name+" "+what+" against the product and QKVSplit", outs[i][0], s[i])
					}
				} else {
					_, cqkv := e.alloc(dt, c.t, n)
					if err := e.c.Gemm(cqkv, cx, cw, false, true, 1, 0); err != nil {
						t.Fatal(err)
					}
					if err := e.c.QKVSplit(cq, ck, cv, cqkv, cb, cp, 1e6, c.sc); err != nil {
						t.Fatal(err)
					}
					for i, what := range []string{"q", "k", "v"} {
						e.compare(name+" "+what, outs[i][0], outs[i][1], tolFor(false, dt))
					}
				}
				var again [3]gpu.Tensor
				for i, o := range outs {
					again[i], _ = e.alloc(dt, o[0].Shape...)
				}
				if err := e.g.QKVRoPE(again[0], again[1], again[2], gx, gw, gb, gp, scratch, 1e6, c.sc); err != nil {
					t.Fatalf("%s, again: %v", name, err)
				}
				for i, what := range []string{"q", "k", "v"} {
					e.sameBits(name+" "+what+", a second run against the first", again[i], outs[i][0])
				}
			}
		}
	}
}

// smallInts returns n integers in [-r, r] as floats: products of them sum
// exactly in float32 over short reductions, whatever the order.
func (e *env) smallInts(n, r int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(e.r.IntN(2*r+1) - r)
	}
	return v
}

// Operands the kernel does not take are refused with gpu.ErrNotFused (or,
// on a GPU without wgmma, every call is).
func TestQKVRoPERefuses(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		name       string
		dt         gpu.DType
		k, hq, hkv int
		d          int
	}{
		{"f32", gpu.F32, 64, 2, 1, 64},
		{"K 96", gpu.BF16, 96, 2, 1, 64},
		{"head dim 32", gpu.BF16, 64, 4, 2, 32},
	} {
		e.off = 0
		n := (c.hq + 2*c.hkv) * c.d
		x, _ := e.alloc(c.dt, 4, c.k)
		w, _ := e.alloc(c.dt, n, c.k)
		q, _ := e.alloc(c.dt, 4, c.hq, c.d)
		k, _ := e.alloc(c.dt, 4, c.hkv, c.d)
		v, _ := e.alloc(c.dt, 4, c.hkv, c.d)
		s, _ := e.alloc(c.dt, 4, n)
		p, _ := e.ids(make([]int32, 4))
		if err := e.g.QKVRoPE(q, k, v, x, w, gpu.Tensor{}, p, s, 1e6, nil); !errors.Is(err, gpu.ErrNotFused) {
			t.Errorf("%s: got %v, want gpu.ErrNotFused", c.name, err)
		}
	}
}

// BenchmarkQKVRoPE times the attention's projections with their biases
// and RoPE at one model's shapes, with pseudo-random operands (scrambled):
// cuBLASLt's product and QKVSplit, the product alone and QKVRoPE.
// RLPIPE_BENCH_QKV="T,K,HQ,HKV,D" picks the shapes (default Qwen2.5-3B's,
// 16384 tokens: "16384,2048,16,2,128"):
//
//	go test -run '^$' -bench QKVRoPE -benchtime 20x ./gpu/cuda
//
// A kernel this GPU does not run skips; without a driver it skips.
func BenchmarkQKVRoPE(bb *testing.B) {
	b := backend(bb)
	T, K, HQ, HKV, D := 16384, 2048, 16, 2, 128
	if s := os.Getenv("RLPIPE_BENCH_QKV"); s != "" {
		if _, err := fmt.Sscanf(s, "%d,%d,%d,%d,%d", &T, &K, &HQ, &HKV, &D); err != nil {
			bb.Fatalf("RLPIPE_BENCH_QKV=%q: want T,K,HQ,HKV,D: %v", s, err)
		}
	}
	N := (HQ + 2*HKV) * D
	mem, err := b.Alloc(int64(T*K+N*K+N+2*T*N)*2 + int64(4*T) + 16<<10)
	if err != nil {
		bb.Fatal(err)
	}
	defer b.Free(mem)
	var off int64
	ten := func(scale float32, shape ...int) gpu.Tensor { return benchScrambled(bb, b, mem, &off, scale, shape...) }
	x, w, bias := ten(1, T, K), ten(0.05, N, K), ten(0.5, N)
	qkv := ten(0, T, N)
	q, k, v := ten(0, T, HQ, D), ten(0, T, HKV, D), ten(0, T, HKV, D)
	pos := benchTensor(bb, mem, &off, gpu.I32, T)
	pv := make([]int32, T)
	for i := range pv {
		pv[i] = int32(i % 2048)
	}
	if err := b.UploadI32(pos, pv); err != nil {
		bb.Fatal(err)
	}
	flops := 2 * float64(T) * float64(K) * float64(N)
	shape := fmt.Sprintf("%dx%dx%d", T, N, K)
	for _, c := range []struct {
		name string
		f    func() error
	}{
		{"unfused " + shape, func() error {
			if err := b.Gemm(qkv, x, w, false, true, 1, 0); err != nil {
				return err
			}
			return b.QKVSplit(q, k, v, qkv, bias, pos, 1e6, nil)
		}},
		{"product only " + shape, func() error { return b.Gemm(qkv, x, w, false, true, 1, 0) }},
		{"fused " + shape, func() error { return b.QKVRoPE(q, k, v, x, w, bias, pos, qkv, 1e6, nil) }},
	} {
		timeOp(bb, b, c.name, flops, 0, c.f)
	}
}
