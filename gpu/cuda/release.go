//go:build cgo

package cuda

/*
#include "rlcuda.h"
*/
import "C"

import (
	"errors"
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
)

// errReleased is the error of a kernel or product issued while the
// backend's workspace is released.
var errReleased = errors.New("cuda: the backend's workspace is released (the trainer is asleep): no kernel can run until it is reacquired")

// Release frees the device memory behind m (from Alloc) and keeps m, with
// its size, so that Reacquire can allocate it again: views of m fail with
// "memory was released" until then. Pending work is waited for first.
func (b *Backend) Release(m gpu.Memory) error {
	dm, ok := m.(*DeviceMemory)
	if !ok || dm.d != b.d {
		return fmt.Errorf("release: memory %T is not device memory of this backend", m)
	}
	return b.d.do(func() error {
		if dm.ptr == 0 {
			return nil
		}
		if err := cuErr("cuCtxSynchronize", C.cuCtxSynchronize_()); err != nil {
			return err
		}
		err := cuErr("cuMemFree", C.cuMemFree_(C.CUdeviceptr(dm.ptr)))
		dm.ptr, dm.released = 0, true
		return err
	})
}

// Reacquire allocates m's device memory again after Release (contents
// undefined; the address may differ, views of m follow it).
func (b *Backend) Reacquire(m gpu.Memory) error {
	dm, ok := m.(*DeviceMemory)
	if !ok || dm.d != b.d {
		return fmt.Errorf("reacquire: memory %T is not device memory of this backend", m)
	}
	return b.d.do(func() error {
		if !dm.released {
			return nil
		}
		var p C.CUdeviceptr
		if err := cuErr(fmt.Sprintf("cuMemAlloc(%d bytes)", dm.size), C.cuMemAlloc_(&p, C.size_t(dm.size))); err != nil {
			return err
		}
		dm.ptr, dm.released = uint64(p), false
		return nil
	})
}

// ReleaseWorkspace frees the backend's own device memory: the cuBLASLt
// workspace, the error flag and every stream's reduction scratch (what the
// plan's backend reserve counts). Until ReacquireWorkspace no kernel or
// product runs; copies and collectives on live memory still do.
func (b *Backend) ReleaseWorkspace() error {
	d := b.d
	return d.do(func() error {
		if d.released {
			return nil
		}
		if err := cuErr("cuCtxSynchronize", C.cuCtxSynchronize_()); err != nil {
			return err
		}
		if err := d.checkFlag(); err != nil {
			return err
		}
		var errs []error
		if d.internal != 0 {
			errs = append(errs, cuErr("cuMemFree", C.cuMemFree_(d.internal)))
			d.internal, d.flag = 0, 0
		}
		for s := range d.streams {
			if s.scratch != 0 {
				errs = append(errs, cuErr("cuMemFree", C.cuMemFree_(s.scratch)))
				s.scratch = 0
			}
		}
		d.released = true
		return errors.Join(errs...)
	})
}

// ReacquireWorkspace allocates what ReleaseWorkspace freed.
func (b *Backend) ReacquireWorkspace() error {
	d := b.d
	return d.do(func() error {
		if !d.released {
			return nil
		}
		if err := cuErr("cuMemAlloc (internal workspace)", C.cuMemAlloc_(&d.internal, workspaceBytes+flagBytes)); err != nil {
			return err
		}
		d.flag = uint64(d.internal) + workspaceBytes
		for s := range d.streams {
			if err := cuErr("cuMemAlloc (stream scratch)", C.cuMemAlloc_(&s.scratch, streamScratchBytes)); err != nil {
				return err
			}
			if err := s.zeroTileCounter(); err != nil {
				return err
			}
		}
		d.released = false
		return d.memsetFlag()
	})
}
