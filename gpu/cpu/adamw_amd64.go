package cpu

import (
	"os"

	"golang.org/x/sys/cpu"
)

// hasAVX2 says whether the CPU and the OS support 256-bit AVX2 vectors.
// RLPIPE_CPU_SCALAR turns the vector kernels off (for comparisons).
var hasAVX2 = cpu.X86.HasAVX2 && os.Getenv("RLPIPE_CPU_SCALAR") != "1"

// adamwAVX2 takes the step over the first n elements (n a multiple of 8).
//
//go:noescape
func adamwAVX2(p, grad, m, v *float32, n int, c *adamwConsts)

// adamwVector takes the step over the longest prefix of whole vectors and
// returns its length (0 without AVX2).
func adamwVector(p, g, m, v []float32, c *adamwConsts) int {
	n := len(p) &^ 7
	if !hasAVX2 || n == 0 {
		return 0
	}
	g, m, v = g[:n], m[:n], v[:n]
	adamwAVX2(&p[0], &g[0], &m[0], &v[0], n, c)
	return n
}

// adamwBF16AVX2 takes the step over the first n elements (n a multiple of
// 8) and writes the updated params' bfloat16 bits into out.
//
//go:noescape
func adamwBF16AVX2(p, grad, m, v *float32, out *uint16, n int, c *adamwConsts)

// adamwBF16Vector takes the step and writes the bf16 copy over the longest
// prefix of whole vectors, and returns its length (0 without AVX2).
func adamwBF16Vector(p, g, m, v []float32, out []uint16, c *adamwConsts) int {
	n := len(p) &^ 7
	if !hasAVX2 || n == 0 {
		return 0
	}
	g, m, v, out = g[:n], m[:n], v[:n], out[:n]
	adamwBF16AVX2(&p[0], &g[0], &m[0], &v[0], &out[0], n, c)
	return n
}

// sumSquaresAVX2 writes sixteen partial sums of squares of the first n
// elements of x (n a multiple of 16) to out.
//
//go:noescape
func sumSquaresAVX2(x *float32, n int, out *[16]float64)

// sumSquaresVector returns the sum of squares of the longest prefix of x
// of whole 16-element blocks, and the prefix's length (0 without AVX2):
// sixteen float64 partial sums, added in a fixed order.
func sumSquaresVector(x []float32) (float64, int) {
	n := len(x) &^ 15
	if !hasAVX2 || n == 0 {
		return 0, 0
	}
	var parts [16]float64
	sumSquaresAVX2(&x[0], n, &parts)
	s := 0.0
	for _, p := range parts {
		s += p
	}
	return s, n
}

// bf16FromF32AVX2 converts the first n elements of src (n a multiple of 8)
// to bfloat16 bits in dst, as gpu.BF16FromF32 does.
//
//go:noescape
func bf16FromF32AVX2(dst *uint16, src *float32, n int)

// bf16Vector converts the longest prefix of src of whole 8-element vectors
// into dst (of src's length) and returns its length (0 without AVX2).
func bf16Vector(dst []uint16, src []float32) int {
	n := len(src) &^ 7
	if !hasAVX2 || n == 0 {
		return 0
	}
	dst = dst[:n]
	bf16FromF32AVX2(&dst[0], &src[0], n)
	return n
}

// addScaledAVX2 adds s*x into dst over the first n elements (n a multiple
// of 8), with Go's float32 roundings.
//
//go:noescape
func addScaledAVX2(dst, x *float32, n int, s float32)

// addScaledVector adds s*x into dst over the longest prefix of whole
// vectors and returns its length (0 without AVX2).
func addScaledVector(dst, x []float32, s float32) int {
	n := len(dst) &^ 7
	if !hasAVX2 || n == 0 {
		return 0
	}
	x = x[:n]
	addScaledAVX2(&dst[0], &x[0], n, s)
	return n
}
