package cpu

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/rlpipe/rlpipe/gpu"
)

// Upload converts src to dst's dtype and writes it.
func (b *Backend) Upload(dst gpu.Tensor, src []float32) error {
	d, err := bytesOf(dst)
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	if len(src) != dst.Numel() {
		return fmt.Errorf("upload: %d values for %d elements", len(src), dst.Numel())
	}
	return gpu.EncodeF32(d, src, dst.DType)
}

// UploadI32 writes src into an I32 tensor.
func (b *Backend) UploadI32(dst gpu.Tensor, src []int32) error {
	d, err := i32View("upload", "dst", dst)
	if err != nil {
		return err
	}
	if len(src) != len(d) {
		return fmt.Errorf("upload: %d values for %d elements", len(src), len(d))
	}
	copy(d, src)
	return nil
}

// UploadBytes writes raw little-endian bytes.
func (b *Backend) UploadBytes(dst gpu.Tensor, src []byte) error {
	d, err := bytesOf(dst)
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	if len(src) != len(d) {
		return fmt.Errorf("upload: %d bytes for a %d-byte tensor", len(src), len(d))
	}
	copy(d, src)
	return nil
}

// Download converts src to float32 into dst.
func (b *Backend) Download(dst []float32, src gpu.Tensor) error {
	s, err := bytesOf(src)
	if err != nil {
		return fmt.Errorf("download: %w", err)
	}
	if len(dst) != src.Numel() {
		return fmt.Errorf("download: %d values for %d elements", len(dst), src.Numel())
	}
	return gpu.DecodeF32(dst, s, src.DType)
}

// DownloadI32 reads an I32 tensor.
func (b *Backend) DownloadI32(dst []int32, src gpu.Tensor) error {
	s, err := i32View("download", "src", src)
	if err != nil {
		return err
	}
	if len(dst) != len(s) {
		return fmt.Errorf("download: %d values for %d elements", len(dst), len(s))
	}
	copy(dst, s)
	return nil
}

// DownloadBytes reads raw bytes.
func (b *Backend) DownloadBytes(dst []byte, src gpu.Tensor) error {
	s, err := bytesOf(src)
	if err != nil {
		return fmt.Errorf("download: %w", err)
	}
	if len(dst) != len(s) {
		return fmt.Errorf("download: %d bytes for a %d-byte tensor", len(dst), len(s))
	}
	copy(dst, s)
	return nil
}

// Copy copies src into dst with a dtype cast.
func (b *Backend) Copy(dst, src gpu.Tensor) error {
	d, err := bytesOf(dst)
	if err != nil {
		return fmt.Errorf("copy: dst: %w", err)
	}
	s, err := bytesOf(src)
	if err != nil {
		return fmt.Errorf("copy: src: %w", err)
	}
	if dst.Numel() != src.Numel() {
		return fmt.Errorf("copy: dst %v and src %v differ in element count", dst.Shape, src.Shape)
	}
	if err := aliasOK("copy", "dst", "src", dst, src); err != nil {
		return err
	}
	if dst.DType == src.DType {
		copy(d, s)
		return nil
	}
	n := dst.Numel()
	switch {
	case dst.DType == gpu.I32 || src.DType == gpu.I32:
		return b.copyInt(dst, src, d, s, n)
	}
	dv, _ := floatView("copy", "dst", dst)
	sv, _ := floatView("copy", "src", src)
	b.parallel(n, 1<<15, func(_, lo, hi int) {
		if sv.f != nil && dv.dt == gpu.BF16 {
			// In 8-wide vectors where the CPU has AVX2, the same bits.
			lo += bf16Vector(dv.h[lo:hi], sv.f[lo:hi])
		}
		var buf [1024]float32
		for i := lo; i < hi; i += len(buf) {
			c := buf[:min(len(buf), hi-i)]
			sv.load(c, i)
			dv.store(i, c)
		}
	})
	return nil
}

func (b *Backend) copyInt(dst, src gpu.Tensor, d, s []byte, n int) error {
	const chunk = 1024
	buf := make([]float32, chunk)
	if src.DType == gpu.I32 {
		// Integers convert by value; float32 loses precision above 2^24,
		// like a torch cast.
		for i := 0; i < n; i += chunk {
			c := buf[:min(chunk, n-i)]
			if err := gpu.DecodeF32(c, s[4*i:4*(i+len(c))], gpu.I32); err != nil {
				return fmt.Errorf("copy: %w", err)
			}
			es := dst.DType.Size()
			if err := gpu.EncodeF32(d[es*i:es*(i+len(c))], c, dst.DType); err != nil {
				return fmt.Errorf("copy: %w", err)
			}
		}
		return nil
	}
	es := src.DType.Size()
	for i := 0; i < n; i += chunk {
		c := buf[:min(chunk, n-i)]
		if err := gpu.DecodeF32(c, s[es*i:es*(i+len(c))], src.DType); err != nil {
			return fmt.Errorf("copy: %w", err)
		}
		if err := gpu.EncodeF32(d[4*i:4*(i+len(c))], c, gpu.I32); err != nil {
			return fmt.Errorf("copy: %w", err)
		}
	}
	return nil
}

// Fill sets every element of dst to v.
func (b *Backend) Fill(dst gpu.Tensor, v float32) error {
	if dst.DType == gpu.I32 {
		d, err := i32View("fill", "dst", dst)
		if err != nil {
			return err
		}
		x := gpu.F32ToI32(v)
		for i := range d {
			d[i] = x
		}
		return nil
	}
	dv, err := floatView("fill", "dst", dst)
	if err != nil {
		return err
	}
	switch dst.DType {
	case gpu.F32:
		for i := range dv.f {
			dv.f[i] = v
		}
	default:
		h := gpu.BF16FromF32(v)
		if dst.DType == gpu.F16 {
			h = gpu.F16FromF32(v)
		}
		for i := range dv.h {
			dv.h[i] = h
		}
	}
	return nil
}

// Zero sets every byte of dst to zero.
func (b *Backend) Zero(dst gpu.Tensor) error {
	d, err := bytesOf(dst)
	if err != nil {
		return fmt.Errorf("zero: %w", err)
	}
	clear(d)
	return nil
}

// SumSquaresTo writes SumSquares(x) into dst's 8 bytes, little-endian.
func (b *Backend) SumSquaresTo(dst, x gpu.Tensor) error {
	d, err := bytesOf(dst)
	if err != nil {
		return fmt.Errorf("sumsquares: dst: %w", err)
	}
	if len(d) != 8 {
		return fmt.Errorf("sumsquares: dst has %d bytes, want 8", len(d))
	}
	ss, err := b.SumSquares(x)
	if err != nil {
		return err
	}
	binary.LittleEndian.PutUint64(d, math.Float64bits(ss))
	return nil
}

// sumSquaresSpan is the elements of one partial sum of SumSquares: the
// partials, and so the sum's bits, do not depend on the worker count, and
// a worker the OS stops holds the sum back by one span at most.
const sumSquaresSpan = 1 << 18

// SumSquares returns Σ x² in float64: a float64 partial sum for each span
// of sumSquaresSpan elements, the partials added in order.
func (b *Backend) SumSquares(x gpu.Tensor) (float64, error) {
	xv, err := floatView("sumsquares", "x", x)
	if err != nil {
		return 0, err
	}
	n := xv.n
	parts := make([]float64, (n+sumSquaresSpan-1)/sumSquaresSpan)
	spans(b, n, sumSquaresSpan, func(lo, hi int) {
		w := lo / sumSquaresSpan
		s := 0.0
		if xv.f != nil {
			// An F32 view is read in place, in 16-wide float64 sums where
			// the CPU has AVX2.
			v, done := sumSquaresVector(xv.f[lo:hi])
			s, lo = v, lo+done
		}
		var buf [1024]float32
		for i := lo; i < hi; i += len(buf) {
			for _, v := range xv.get(buf[:], i, min(len(buf), hi-i)) {
				s += float64(v) * float64(v)
			}
		}
		parts[w] = s
	})
	s := 0.0
	for _, p := range parts {
		s += p
	}
	return s, nil
}
