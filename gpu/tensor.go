package gpu

import (
	"fmt"
	"unsafe"
)

// Memory is a block of memory owned by a backend: the device arena, or pinned
// host memory. Tensors are views into it.
type Memory interface {
	// Size returns the size of the block in bytes.
	Size() int64
}

// HostMemory is Memory whose bytes the host can address directly (the CPU
// backend's arena, pinned host memory). The loopback communicator and the
// CPU backend work on it.
type HostMemory interface {
	Memory
	// HostBytes returns the whole block. Its length is Size().
	HostBytes() []byte
}

// Tensor is a dense, row-major, contiguous view of Memory: Shape elements of
// DType starting Off bytes into Mem. A Tensor is a small value; copying it
// does not copy data. The zero Tensor (Mem == nil) is "absent" and is
// accepted by ops where the documentation says an operand may be empty.
type Tensor struct {
	Mem   Memory
	Off   int64
	DType DType
	Shape []int
}

// NewTensor returns the view of mem at byte offset off and checks it (see
// Tensor.Check).
func NewTensor(mem Memory, off int64, dt DType, shape ...int) (Tensor, error) {
	t := Tensor{Mem: mem, Off: off, DType: dt, Shape: append([]int(nil), shape...)}
	return t, t.Check()
}

// Numel returns the number of elements (1 for a zero-rank tensor).
func (t Tensor) Numel() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Bytes returns the size of the view in bytes.
func (t Tensor) Bytes() int64 { return int64(t.Numel()) * int64(t.DType.Size()) }

// Empty reports whether t is absent (no Mem) or holds no elements.
func (t Tensor) Empty() bool { return t.Mem == nil || t.Numel() == 0 }

// Dim returns the size of dimension i, counting negative i from the end, or
// 0 when i is out of range.
func (t Tensor) Dim(i int) int {
	if i < 0 {
		i += len(t.Shape)
	}
	if i < 0 || i >= len(t.Shape) {
		return 0
	}
	return t.Shape[i]
}

// Check reports whether t is a well-formed view: valid DType, non-negative
// dimensions, Mem present, the view inside Mem, and Off aligned to the
// element size.
func (t Tensor) Check() error {
	if !t.DType.Valid() {
		return fmt.Errorf("tensor has invalid dtype %v", t.DType)
	}
	n := int64(1)
	for _, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("tensor has negative dimension in shape %v", t.Shape)
		}
		n *= int64(d)
		if n > 1<<50 {
			return fmt.Errorf("tensor shape %v is too large", t.Shape)
		}
	}
	if t.Mem == nil {
		return fmt.Errorf("tensor %v has no memory", t.Shape)
	}
	if t.Off < 0 || t.Off%int64(t.DType.Size()) != 0 {
		return fmt.Errorf("tensor offset %d is not aligned to %v", t.Off, t.DType)
	}
	if end := t.Off + n*int64(t.DType.Size()); end > t.Mem.Size() {
		return fmt.Errorf("tensor %v %v at offset %d ends at %d, past memory size %d", t.DType, t.Shape, t.Off, end, t.Mem.Size())
	}
	return nil
}

// Reshape returns the same bytes viewed with another shape of equal element
// count. One dimension may be -1 and is inferred.
func (t Tensor) Reshape(shape ...int) (Tensor, error) {
	s := append([]int(nil), shape...)
	infer, n := -1, 1
	for i, d := range s {
		switch {
		case d == -1 && infer < 0:
			infer = i
		case d < 0:
			return Tensor{}, fmt.Errorf("reshape: bad shape %v", shape)
		default:
			n *= d
		}
	}
	if infer >= 0 {
		if n == 0 || t.Numel()%n != 0 {
			return Tensor{}, fmt.Errorf("reshape: cannot infer %v from %d elements", shape, t.Numel())
		}
		s[infer] = t.Numel() / n
		n *= s[infer]
	}
	if n != t.Numel() {
		return Tensor{}, fmt.Errorf("reshape: shape %v has %d elements, tensor %v has %d", shape, n, t.Shape, t.Numel())
	}
	t.Shape = s
	return t, nil
}

// Rows returns rows [lo, hi) along the first dimension.
func (t Tensor) Rows(lo, hi int) (Tensor, error) {
	if len(t.Shape) == 0 {
		return Tensor{}, fmt.Errorf("rows: zero-rank tensor")
	}
	if lo < 0 || hi < lo || hi > t.Shape[0] {
		return Tensor{}, fmt.Errorf("rows: range [%d,%d) outside dimension %d", lo, hi, t.Shape[0])
	}
	row := int64(t.Numel()/max(t.Shape[0], 1)) * int64(t.DType.Size())
	s := append([]int(nil), t.Shape...)
	s[0] = hi - lo
	return Tensor{Mem: t.Mem, Off: t.Off + int64(lo)*row, DType: t.DType, Shape: s}, nil
}

// Flat returns the elements [lo, hi) of t as a one-dimensional view.
func (t Tensor) Flat(lo, hi int) (Tensor, error) {
	if lo < 0 || hi < lo || hi > t.Numel() {
		return Tensor{}, fmt.Errorf("flat: range [%d,%d) outside %d elements", lo, hi, t.Numel())
	}
	return Tensor{Mem: t.Mem, Off: t.Off + int64(lo)*int64(t.DType.Size()), DType: t.DType, Shape: []int{hi - lo}}, nil
}

// HostBytes returns the bytes of the view when Mem is HostMemory.
func (t Tensor) HostBytes() ([]byte, error) {
	if err := t.Check(); err != nil {
		return nil, err
	}
	hm, ok := t.Mem.(HostMemory)
	if !ok {
		return nil, fmt.Errorf("tensor memory %T is not host-addressable", t.Mem)
	}
	b := hm.HostBytes()
	if len(b) == 0 && hm.Size() > 0 {
		return nil, fmt.Errorf("tensor memory was released (the trainer is asleep)")
	}
	if int64(len(b)) != hm.Size() {
		return nil, fmt.Errorf("host memory reports %d bytes but holds %d", hm.Size(), len(b))
	}
	v := b[t.Off : t.Off+t.Bytes() : t.Off+t.Bytes()]
	if len(v) > 0 && uintptr(unsafe.Pointer(&v[0]))%uintptr(t.DType.Size()) != 0 {
		return nil, fmt.Errorf("tensor data at offset %d is not aligned to %v", t.Off, t.DType)
	}
	return v, nil
}

// SameShape reports whether a and b have identical shapes.
func SameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// String describes the view, e.g. "bf16[4 8]@128".
func (t Tensor) String() string { return fmt.Sprintf("%v%v@%d", t.DType, t.Shape, t.Off) }
