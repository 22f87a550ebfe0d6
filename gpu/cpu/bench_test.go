package cpu

import (
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

func benchEnv(b *testing.B, bytes int64) (*Backend, func(dt gpu.DType, shape ...int) gpu.Tensor) {
	be := New()
	mem, err := be.Alloc(bytes)
	if err != nil {
		b.Fatal(err)
	}
	var off int64
	return be, func(dt gpu.DType, shape ...int) gpu.Tensor {
		x, err := gpu.NewTensor(mem, off, dt, shape...)
		if err != nil {
			b.Fatal(err)
		}
		off += (x.Bytes() + 63) / 64 * 64
		return x
	}
}

// BenchmarkGemmLinear is a bf16 linear layer of a 0.5B-class model on 512
// tokens: [512,896] @ [4864,896]ᵀ.
func BenchmarkGemmLinear(b *testing.B) {
	be, mk := benchEnv(b, 64<<20)
	x, w, y := mk(gpu.BF16, 512, 896), mk(gpu.BF16, 4864, 896), mk(gpu.BF16, 512, 4864)
	b.SetBytes(0)
	for b.Loop() {
		if err := be.Gemm(y, x, w, false, true, 1, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(2*512*896*4864*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkAttention is one layer of causal attention over 1024 packed
// tokens (two sequences) with 14 query and 2 kv heads of dimension 64.
func BenchmarkAttention(b *testing.B) {
	be, mk := benchEnv(b, 64<<20)
	const t, hq, hkv, d = 1024, 14, 2, 64
	q, k, v := mk(gpu.BF16, t, hq, d), mk(gpu.BF16, t, hkv, d), mk(gpu.BF16, t, hkv, d)
	out, lse := mk(gpu.BF16, t, hq, d), mk(gpu.F32, hq, t)
	cu := mk(gpu.I32, 3)
	if err := be.UploadI32(cu, []int32{0, 600, t}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := be.Attention(out, lse, q, k, v, cu, 0.125); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAdamW is the host optimizer step of an offloaded model over 32M
// fp32 elements (one 1.5B-class decoder layer is about 47M), against a
// streaming add over the same memory: their bytes per second say whether
// AdamW is bound by memory (28 bytes an element) or by its arithmetic.
func BenchmarkAdamW(b *testing.B) {
	const n = 32 << 20
	be, mk := benchEnv(b, 4*4*n+2*n+4096)
	p, g, m, v := mk(gpu.F32, n), mk(gpu.F32, n), mk(gpu.F32, n), mk(gpu.F32, n)
	st := gpu.AdamWStep{LR: 1e-6, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: 3, GradScale: 1}
	// Values in every page before the clock starts: a first touch costs
	// more than the step.
	vals := make([]float32, n)
	for i := range vals {
		vals[i] = float32(i%1000) * 1e-3
	}
	for _, x := range []gpu.Tensor{p, g, m, v} {
		if err := be.Upload(x, vals); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("adamw", func(b *testing.B) {
		b.SetBytes(28 * n)
		for b.Loop() {
			if err := be.AdamW(p, g, m, v, st); err != nil {
				b.Fatal(err)
			}
		}
	})
	h := mk(gpu.BF16, n)
	if err := be.Copy(h, p); err != nil { // touched before the clock
		b.Fatal(err)
	}
	b.Run("adamw with bf16 copy", func(b *testing.B) {
		b.SetBytes(30 * n)
		for b.Loop() {
			if err := be.AdamWBF16(p, g, m, v, h, st); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sumsquares", func(b *testing.B) {
		b.SetBytes(4 * n)
		for b.Loop() {
			if _, err := be.SumSquares(g); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cast to bf16", func(b *testing.B) {
		b.SetBytes(6 * n)
		for b.Loop() {
			if err := be.Copy(h, p); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("add", func(b *testing.B) {
		b.SetBytes(12 * n)
		for b.Loop() {
			if err := be.AddScaled(p, g, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkAddScaled times the host add of offloaded grads (stages'
// hostAdder): dst += x over 32M float32s, 12 bytes an element.
func BenchmarkAddScaled(b *testing.B) {
	const n = 32 << 20
	be, mk := benchEnv(b, 2*4*n+4096)
	d, x := mk(gpu.F32, n), mk(gpu.F32, n)
	vals := make([]float32, n)
	for i := range vals {
		vals[i] = float32(i%1000) * 1e-3
	}
	for _, t := range []gpu.Tensor{d, x} {
		if err := be.Upload(t, vals); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(12 * n)
	for b.Loop() {
		if err := be.AddScaled(d, x, 1); err != nil {
			b.Fatal(err)
		}
	}
}
