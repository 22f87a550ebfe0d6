//go:build cgo

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
		if m.released {
			return 0, fmt.Errorf("%s: %s memory was released (the trainer is asleep)", op, name)
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

// fusedAddrs returns the addresses of a fused kernel's operands, which
// must all be of dtype dt and 16-byte aligned (its vector and TMA
// accesses); others give an error wrapping gpu.ErrNotFused.
func (b *Backend) fusedAddrs(op string, dt gpu.DType, ns ...named) ([]uint64, error) {
	as := make([]uint64, len(ns))
	for i, o := range ns {
		if o.T.DType != dt {
			return nil, fmt.Errorf("%s: %s is %v, want %v: %w", op, o.Name, o.T.DType, dt, gpu.ErrNotFused)
		}
		a, err := b.faddr(op, o.Name, o.T)
		if err != nil {
			return nil, err
		}
		if a%16 != 0 {
			return nil, fmt.Errorf("%s: %s is not 16-byte aligned: %w", op, o.Name, gpu.ErrNotFused)
		}
		as[i] = a
	}
	return as, nil
}

// taddr is addr for an operand of exactly dtype dt.
func (b *Backend) taddr(op, name string, t gpu.Tensor, dt gpu.DType) (uint64, error) {
	if t.Mem != nil && t.DType != dt {
		return 0, fmt.Errorf("%s: %s must be %v, got %v", op, name, dt, t.DType)
	}
	return b.addr(op, name, t)
}

// The argument checks are the gpu package's, shared with every backend.
var (
	need    = gpu.CheckShape
	rank    = gpu.CheckRank
	same    = gpu.SameView
	aliasOK = gpu.CheckAlias
	noAlias = gpu.CheckNoAlias
)

// named and arg are package gpu's Named and Arg.
type named = gpu.Named

var arg = gpu.Arg
