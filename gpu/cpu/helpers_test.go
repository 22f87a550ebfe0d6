package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// env is a test arena: tensors are bump-allocated from one Alloc.
type env struct {
	t   *testing.T
	b   *Backend
	mem gpu.Memory
	off int64
}

func newEnv(t *testing.T) *env {
	t.Helper()
	b := NewWithThreads(3) // More workers than cores exercises the splitting.
	mem, err := b.Alloc(16 << 20)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, b: b, mem: mem}
}

func (e *env) tensor(dt gpu.DType, shape ...int) gpu.Tensor {
	e.t.Helper()
	x, err := gpu.NewTensor(e.mem, e.off, dt, shape...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.off += (x.Bytes() + 63) / 64 * 64
	return x
}

func (e *env) up(dt gpu.DType, vals []float32, shape ...int) gpu.Tensor {
	e.t.Helper()
	x := e.tensor(dt, shape...)
	if err := e.b.Upload(x, vals); err != nil {
		e.t.Fatal(err)
	}
	return x
}

func (e *env) ids(vals []int32) gpu.Tensor {
	e.t.Helper()
	x := e.tensor(gpu.I32, len(vals))
	if err := e.b.UploadI32(x, vals); err != nil {
		e.t.Fatal(err)
	}
	return x
}

func (e *env) down(x gpu.Tensor) []float64 {
	e.t.Helper()
	f := make([]float32, x.Numel())
	if err := e.b.Download(f, x); err != nil {
		e.t.Fatal(err)
	}
	return f64(f)
}

func f64(f []float32) []float64 {
	out := make([]float64, len(f))
	for i, v := range f {
		out[i] = float64(v)
	}
	return out
}

// randn returns n normal values rounded to dt, so that the float64
// reference sees exactly what the backend stores.
func randn(r *rand.Rand, n int, scale float64, dt gpu.DType) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = gpu.Round(dt, float32(r.NormFloat64()*scale))
	}
	return v
}

func rng() *rand.Rand { return rand.New(rand.NewPCG(1, 2)) }

// close reports the first element where |got-want| > atol + rtol*|want|.
func closeTo(t *testing.T, name string, got, want []float64, atol, rtol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: length %d, want %d", name, len(got), len(want))
	}
	worst, at := 0.0, -1
	for i := range got {
		d := math.Abs(got[i] - want[i])
		if !(d <= atol+rtol*math.Abs(want[i])) {
			if at < 0 || d > worst || math.IsNaN(d) {
				worst, at = d, i
			}
		}
	}
	if at >= 0 {
		t.Errorf("%s: element %d = %.8g, want %.8g (diff %.3g)", name, at, got[at], want[at], worst)
	}
}

// numGrad returns the central-difference gradient of f at x.
func numGrad(x []float64, h float64, f func([]float64) float64) []float64 {
	g := make([]float64, len(x))
	for i := range x {
		o := x[i]
		x[i] = o + h
		p := f(x)
		x[i] = o - h
		m := f(x)
		x[i] = o
		g[i] = (p - m) / (2 * h)
	}
	return g
}

func dot64(a, b []float64) float64 {
	s := 0.0
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}
