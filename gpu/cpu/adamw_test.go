package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// TestAdamWVector holds the vector kernel to the Go one, bit for bit, over
// random values and the awkward ones (zeros of both signs, subnormals,
// infinities, NaN), at lengths that leave tails, for both of torch's lerp
// forms and a clipped gradient. Without AVX2 it checks the Go path alone
// against itself and says so.
func TestAdamWVector(t *testing.T) {
	if !hasAVX2 {
		t.Log("no AVX2 (or RLPIPE_CPU_SCALAR=1): the vector kernel is not used here")
	}
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-40, -1e-40, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 3e38, -3e38}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name string
		st   gpu.AdamWStep
	}{
		{"torch defaults", gpu.AdamWStep{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: 1}},
		{"late step, clipped", gpu.AdamWStep{LR: 3e-6, Beta1: 0.9, Beta2: 0.95, Eps: 1e-6, WeightDecay: 0.1, Step: 977, GradScale: 0.37}},
		{"beta1 below 0.5 (the other lerp)", gpu.AdamWStep{LR: 1e-2, Beta1: 0.3, Beta2: 0.9, Eps: 1e-8, Step: 5}},
	} {
		for _, n := range []int{0, 1, 7, 8, 9, 64, 1000, 1 << 15} {
			p, g, m, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
			for i := range n {
				p[i], g[i], m[i] = rng.Float32()*2-1, float32(rng.NormFloat64()), float32(rng.NormFloat64()*0.1)
				v[i] = rng.Float32() * 0.01
				if i%17 == 3 {
					g[i] = special[i%len(special)]
				}
				if i%23 == 5 {
					m[i], v[i] = special[(i/23)%len(special)], float32(math.Abs(float64(special[(i/7)%len(special)])))
				}
			}
			want := [4][]float32{clone(p), clone(g), clone(m), clone(v)}
			c := newAdamWConsts(tc.st)
			c.scalar(want[0], want[1], want[2], want[3])
			c.update(p, g, m, v)
			for k, got := range [4][]float32{p, g, m, v} {
				for i := range got {
					if !sameBits(got[i], want[k][i]) {
						t.Fatalf("%s, n %d: %s[%d] = %v (%#x), the Go kernel gives %v (%#x)", tc.name, n, "pgmv"[k:k+1], i, got[i], math.Float32bits(got[i]), want[k][i], math.Float32bits(want[k][i]))
					}
				}
			}
		}
	}
}

func clone(x []float32) []float32 { return append([]float32(nil), x...) }

// sameBits is bitwise equality, with every NaN equal to every other (x86
// propagates one operand's NaN payload or the other's depending on the
// instruction's operand order).
func sameBits(a, b float32) bool {
	if a != a && b != b {
		return true
	}
	return math.Float32bits(a) == math.Float32bits(b)
}

// TestSumSquaresVector holds the 16-wide sum of squares to a float64 loop:
// every square is exact in float64, so only the order of the additions
// differs (within 1e-13 relative), and an infinity or a NaN comes through.
func TestSumSquaresVector(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 15, 16, 17, 1000, 1 << 16} {
		for _, special := range []float32{0, float32(math.Inf(-1)), float32(math.NaN())} {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(rng.NormFloat64() * 1e-3)
			}
			if special != 0 && n > 0 {
				x[n/2] = special
			}
			want := 0.0
			for _, v := range x {
				want += float64(v) * float64(v)
			}
			got, done := sumSquaresVector(x)
			for _, v := range x[done:] {
				got += float64(v) * float64(v)
			}
			switch {
			case math.IsNaN(want) || math.IsInf(want, 0):
				if got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
					t.Errorf("n %d: %v, want %v", n, got, want)
				}
			case math.Abs(got-want) > 1e-13*want:
				t.Errorf("n %d: %v, want %v", n, got, want)
			}
			if hasAVX2 && done != n&^15 {
				t.Errorf("n %d: the vector kernel took %d elements, want %d", n, done, n&^15)
			}
		}
	}
}

// TestBF16Vector holds the vector float32 to bfloat16 conversion to
// gpu.BF16FromF32, bit for bit: random values, both zeros, subnormals,
// the largest finite values (which round to infinity), infinities, and
// NaNs of both signs with and without payload, at lengths with tails.
func TestBF16Vector(t *testing.T) {
	bits := []uint32{0, 0x80000000, 1, 0x807fffff, 0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000,
		0x7fc00000, 0xffc00000, 0x7f800001, 0xff812345, 0x3f808000, 0x3f818000, 0x3f80ffff, 0x7fffffff, 0xffffffff}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{0, 3, 8, 13, 1024, 4099} {
		src := make([]float32, n)
		for i := range src {
			src[i] = math.Float32frombits(rng.Uint32())
			if i%5 == 0 {
				src[i] = math.Float32frombits(bits[(i/5)%len(bits)])
			}
		}
		got := make([]uint16, n)
		done := bf16Vector(got, src)
		if hasAVX2 && done != n&^7 {
			t.Fatalf("n %d: the vector kernel took %d elements, want %d", n, done, n&^7)
		}
		for i := range src[:done] {
			if want := gpu.BF16FromF32(src[i]); got[i] != want {
				t.Fatalf("n %d: element %d (%#08x) gave %#04x, want %#04x", n, i, math.Float32bits(src[i]), got[i], want)
			}
		}
	}
}

// TestAdamWBF16 holds AdamWBF16 to AdamW followed by a Copy into bf16:
// the same params, moments and copy, bit for bit, with params whose
// rounding takes the odd paths, at lengths that leave a vector's tail and
// that split into several tasks; and it refuses an out of the wrong dtype
// or length, or one overlapping p.
func TestAdamWBF16(t *testing.T) {
	st := gpu.AdamWStep{LR: 3e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 7, GradScale: 0.5}
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{1, 9, 4096, 4097, 3*(1<<14) + 13, adamwSpan + 13} {
		e := newEnv(t)
		vals := func(scale float64) []float32 { return randn(r, n, scale, gpu.F32) }
		pv, gv, mv, vv := vals(1), vals(1), vals(0.1), vals(0.01)
		for i := range vv {
			vv[i] *= vv[i]
		}
		// Values whose rounding takes the odd paths: ties, subnormals,
		// overflow to infinity, infinities and NaNs.
		special := []float32{math.Float32frombits(0x3f808000), math.Float32frombits(0x3f818000), 1e-40, -1e-40, 3.4e38, float32(math.Inf(-1)), float32(math.NaN())}
		for i := 0; i < n; i += 97 {
			pv[i] = special[(i/97)%len(special)]
			gv[i] = 0
		}
		want := [4]gpu.Tensor{e.up(gpu.F32, pv, n), e.up(gpu.F32, gv, n), e.up(gpu.F32, mv, n), e.up(gpu.F32, vv, n)}
		got := [4]gpu.Tensor{e.up(gpu.F32, pv, n), e.up(gpu.F32, gv, n), e.up(gpu.F32, mv, n), e.up(gpu.F32, vv, n)}
		wantOut, gotOut := e.tensor(gpu.BF16, n), e.tensor(gpu.BF16, n)
		if err := e.b.AdamW(want[0], want[1], want[2], want[3], st); err != nil {
			t.Fatal(err)
		}
		if err := e.b.Copy(wantOut, want[0]); err != nil {
			t.Fatal(err)
		}
		if err := e.b.AdamWBF16(got[0], got[1], got[2], got[3], gotOut, st); err != nil {
			t.Fatal(err)
		}
		for k := range got {
			a, _ := got[k].HostBytes()
			b, _ := want[k].HostBytes()
			if string(a) != string(b) {
				t.Fatalf("n %d: %s differs from AdamW's", n, "pgmv"[k:k+1])
			}
		}
		a, _ := gotOut.HostBytes()
		b, _ := wantOut.HostBytes()
		if string(a) != string(b) {
			t.Fatalf("n %d: the bf16 copy differs from Copy's rounding", n)
		}
		for _, tc := range []struct {
			name string
			out  gpu.Tensor
		}{
			{"f32 out", e.tensor(gpu.F32, n)},
			{"short out", e.tensor(gpu.BF16, n+1)},
			{"out over p", gpu.Tensor{Mem: got[0].Mem, Off: got[0].Off, DType: gpu.BF16, Shape: []int{n}}},
		} {
			if err := e.b.AdamWBF16(got[0], got[1], got[2], got[3], tc.out, st); err == nil {
				t.Errorf("n %d, %s: no error", n, tc.name)
			}
		}
	}
}

// TestSumSquaresThreads checks that SumSquares gives the same bits on any
// number of workers (its partial sums are over fixed spans), and that the
// sum is within float64 rounding of a plain loop.
func TestSumSquaresThreads(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	n := 3*sumSquaresSpan + 1001
	vals := randn(r, n, 1e-2, gpu.F32)
	want := 0.0
	for _, v := range vals {
		want += float64(v) * float64(v)
	}
	var first float64
	for i, threads := range []int{1, 2, 3, 7} {
		b := NewWithThreads(threads)
		mem, err := b.Alloc(int64(4 * n))
		if err != nil {
			t.Fatal(err)
		}
		x, err := gpu.NewTensor(mem, 0, gpu.F32, n)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Upload(x, vals); err != nil {
			t.Fatal(err)
		}
		got, err := b.SumSquares(x)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = got
		} else if math.Float64bits(got) != math.Float64bits(first) {
			t.Errorf("%d workers: %v, one worker: %v", threads, got, first)
		}
		if math.Abs(got-want) > 1e-12*want {
			t.Errorf("%d workers: %v, a plain loop: %v", threads, got, want)
		}
	}
}

// TestAdamWGrads16 checks that AdamW with bf16 or f16 grads gives the bits
// of AdamW with the float32 grads of the same values, for AdamW and
// AdamWBF16, over spans of the parallel loop and their tails.
func TestAdamWGrads16(t *testing.T) {
	st := gpu.AdamWStep{LR: 3e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 3, GradScale: 0.5}
	r := rand.New(rand.NewPCG(9, 10))
	for _, gd := range []gpu.DType{gpu.BF16, gpu.F16} {
		for _, n := range []int{1, 9, 4097, adamwSpan + 13} {
			pv, mv, vv := randn(r, n, 1, gpu.F32), randn(r, n, 0.1, gpu.F32), randn(r, n, 0.01, gpu.F32)
			for i := range vv {
				vv[i] *= vv[i]
			}
			gv := randn(r, n, 1, gd) // representable in gd
			for _, bf16Out := range []bool{false, true} {
				e := newEnv(t)
				want := [4]gpu.Tensor{e.up(gpu.F32, pv, n), e.up(gpu.F32, gv, n), e.up(gpu.F32, mv, n), e.up(gpu.F32, vv, n)}
				got := [4]gpu.Tensor{e.up(gpu.F32, pv, n), e.up(gd, gv, n), e.up(gpu.F32, mv, n), e.up(gpu.F32, vv, n)}
				for _, x := range [][4]gpu.Tensor{want, got} {
					var err error
					if bf16Out {
						err = e.b.AdamWBF16(x[0], x[1], x[2], x[3], e.tensor(gpu.BF16, n), st)
					} else {
						err = e.b.AdamW(x[0], x[1], x[2], x[3], st)
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				for _, k := range []int{0, 2, 3} {
					a, _ := got[k].HostBytes()
					b, _ := want[k].HostBytes()
					if string(a) != string(b) {
						t.Fatalf("%v grads, n %d, bf16 out %v: %s differs from AdamW's with float32 grads", gd, n, bf16Out, "pgmv"[k:k+1])
					}
				}
			}
		}
	}
}
