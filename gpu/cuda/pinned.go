//go:build cgo

package cuda

import "unsafe"

// pinnedAddr returns the device address of pinned memory: with unified
// addressing it is the host address.
func pinnedAddr(m *PinnedMemory) uint64 { return uint64(uintptr(m.p)) }

// hostPtr returns a pointer to the first byte of b, or nil when b is empty.
func hostPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}
