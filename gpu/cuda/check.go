package cuda

import (
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
)

// addr checks t and returns the device address of its first element. Both
// device memory and pinned host memory (unified addressing) qualify.
func (b *Backend) addr(op, name string, t gpu.Tensor) (uint64, error) {
	if t.Mem == nil {
		return 0, fmt.Errorf("%s: %s is missing", op, name)
	}
	if err := t.Check(); err != nil {
		return 0, fmt.Errorf("%s: %s: %w", op, name, err)
	}
	switch m := t.Mem.(type) {
	case *DeviceMemory:
		if m.d != b.d {
			return 0, fmt.Errorf("%s: %s lives on another cuda backend", op, name)
		}
		if m.ptr == 0 && m.size > 0 {
			return 0, fmt.Errorf("%s: %s memory was freed", op, name)
		}
		return m.ptr + uint64(t.Off), nil
	case *PinnedMemory:
		if m.d != b.d {
			return 0, fmt.Errorf("%s: %s lives on another cuda backend", op, name)
		}
		if m.p == nil && m.size > 0 {
			return 0, fmt.Errorf("%s: %s memory was freed", op, name)
		}
		return pinnedAddr(m) + uint64(t.Off), nil
	}
	return 0, fmt.Errorf("%s: %s memory %T was not allocated by the cuda backend", op, name, t.Mem)
}

// faddr is addr for a floating-point operand.
func (b *Backend) faddr(op, name string, t gpu.Tensor) (uint64, error) {
	if t.Mem != nil && !t.DType.IsFloat() {
		return 0, fmt.Errorf("%s: %s must be a floating-point tensor, got %v", op, name, t.DType)
	}
	return b.addr(op, name, t)
}

// taddr is addr for an operand of exactly dtype dt.
func (b *Backend) taddr(op, name string, t gpu.Tensor, dt gpu.DType) (uint64, error) {
	if t.Mem != nil && t.DType != dt {
		return 0, fmt.Errorf("%s: %s must be %v, got %v", op, name, dt, t.DType)
	}
	return b.addr(op, name, t)
}

// need checks that t has exactly the given shape.
func need(op, name string, t gpu.Tensor, want ...int) error {
	if t.Mem == nil {
		return fmt.Errorf("%s: %s is missing", op, name)
	}
	if !gpu.SameShape(t.Shape, want) {
		return fmt.Errorf("%s: %s has shape %v, want %v", op, name, t.Shape, want)
	}
	return nil
}

// rank checks that t has r dimensions.
func rank(op, name string, t gpu.Tensor, r int) error {
	if t.Mem == nil {
		return fmt.Errorf("%s: %s is missing", op, name)
	}
	if len(t.Shape) != r {
		return fmt.Errorf("%s: %s must have %d dimensions, has shape %v", op, name, r, t.Shape)
	}
	return nil
}

// overlap reports whether a and b share bytes of the same memory.
func overlap(a, b gpu.Tensor) bool {
	if a.Mem == nil || b.Mem == nil || a.Mem != b.Mem {
		return false
	}
	return a.Off < b.Off+b.Bytes() && b.Off < a.Off+a.Bytes()
}

// same reports whether a and b are the same view.
func same(a, b gpu.Tensor) bool {
	return a.Mem == b.Mem && a.Off == b.Off && a.DType == b.DType && a.Numel() == b.Numel()
}

// aliasOK rejects an output that partially overlaps an input.
func aliasOK(op, outName, inName string, out, in gpu.Tensor) error {
	if overlap(out, in) && !same(out, in) {
		return fmt.Errorf("%s: %s partially overlaps %s", op, outName, inName)
	}
	return nil
}

// noAlias rejects an output that overlaps an input at all.
func noAlias(op, outName, inName string, out, in gpu.Tensor) error {
	if overlap(out, in) {
		return fmt.Errorf("%s: %s must not overlap %s", op, outName, inName)
	}
	return nil
}

// named pairs a tensor with its name for alias checks.
type named struct {
	n string
	t gpu.Tensor
}

// noAliasAll rejects out overlapping any of ins.
func noAliasAll(op, outName string, out gpu.Tensor, ins ...named) error {
	for _, in := range ins {
		if err := noAlias(op, outName, in.n, out, in.t); err != nil {
			return err
		}
	}
	return nil
}
