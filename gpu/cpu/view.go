package cpu

import (
	"fmt"
	"unsafe"

	"github.com/rlpipe/rlpipe/gpu"
)

// fview is a typed view of a floating-point tensor's elements.
type fview struct {
	dt gpu.DType
	f  []float32 // F32
	h  []uint16  // BF16, F16
	n  int
}

// bytesOf returns the bytes of t after checking it lives in host memory.
func bytesOf(t gpu.Tensor) ([]byte, error) { return t.HostBytes() }

// floatView checks t and returns its typed view; op and name label errors.
func floatView(op, name string, t gpu.Tensor) (fview, error) {
	b, err := bytesOf(t)
	if err != nil {
		return fview{}, fmt.Errorf("%s: %s: %w", op, name, err)
	}
	n := t.Numel()
	v := fview{dt: t.DType, n: n}
	if n == 0 {
		return v, nil
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	switch t.DType {
	case gpu.F32:
		v.f = unsafe.Slice((*float32)(p), n)
	case gpu.BF16, gpu.F16:
		v.h = unsafe.Slice((*uint16)(p), n)
	default:
		return fview{}, fmt.Errorf("%s: %s must be a floating-point tensor, got %v", op, name, t.DType)
	}
	return v, nil
}

// f32View checks that t is F32 and returns its elements.
func f32View(op, name string, t gpu.Tensor) ([]float32, error) {
	if t.DType != gpu.F32 {
		return nil, fmt.Errorf("%s: %s must be f32, got %v", op, name, t.DType)
	}
	v, err := floatView(op, name, t)
	return v.f, err
}

// i32View checks that t is I32 and returns its elements.
func i32View(op, name string, t gpu.Tensor) ([]int32, error) {
	if t.DType != gpu.I32 {
		return nil, fmt.Errorf("%s: %s must be i32, got %v", op, name, t.DType)
	}
	b, err := bytesOf(t)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", op, name, err)
	}
	if len(b) == 0 {
		return nil, nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(b))), t.Numel()), nil
}

// load converts len(dst) elements starting at off into dst.
func (v fview) load(dst []float32, off int) {
	switch v.dt {
	case gpu.F32:
		copy(dst, v.f[off:off+len(dst)])
	case gpu.BF16:
		s := v.h[off : off+len(dst)]
		for i, x := range s {
			dst[i] = gpu.F32FromBF16(x)
		}
	case gpu.F16:
		s := v.h[off : off+len(dst)]
		for i, x := range s {
			dst[i] = gpu.F32FromF16(x)
		}
	}
}

// get returns n elements from off as float32: the tensor's own storage for
// F32 (no copy), otherwise converted into buf[:n].
func (v fview) get(buf []float32, off, n int) []float32 {
	if v.dt == gpu.F32 {
		return v.f[off : off+n : off+n]
	}
	d := buf[:n]
	v.load(d, off)
	return d
}

// store writes src at off, rounding to the view's dtype.
func (v fview) store(off int, src []float32) {
	switch v.dt {
	case gpu.F32:
		copy(v.f[off:off+len(src)], src)
	case gpu.BF16:
		d := v.h[off : off+len(src)]
		for i, x := range src {
			d[i] = gpu.BF16FromF32(x)
		}
	case gpu.F16:
		d := v.h[off : off+len(src)]
		for i, x := range src {
			d[i] = gpu.F16FromF32(x)
		}
	}
}

// at returns element i as float32.
func (v fview) at(i int) float32 {
	switch v.dt {
	case gpu.BF16:
		return gpu.F32FromBF16(v.h[i])
	case gpu.F16:
		return gpu.F32FromF16(v.h[i])
	}
	return v.f[i]
}

// set writes element i, rounding to the view's dtype.
func (v fview) set(i int, x float32) {
	switch v.dt {
	case gpu.BF16:
		v.h[i] = gpu.BF16FromF32(x)
	case gpu.F16:
		v.h[i] = gpu.F16FromF32(x)
	default:
		v.f[i] = x
	}
}

// The argument checks are the gpu package's, shared with every backend.
var (
	need    = gpu.CheckShape
	rank    = gpu.CheckRank
	aliasOK = gpu.CheckAlias
	noAlias = gpu.CheckNoAlias
)
