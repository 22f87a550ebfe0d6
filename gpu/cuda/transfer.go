//go:build cgo

package cuda

/*
#include "rlcuda.h"
*/
import "C"

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/rlpipe/rlpipe/gpu"
)

// Transfers. Uploads convert on the host into dst's dtype and copy the bytes
// with cuMemcpyHtoDAsync on the view's stream (from pageable Go memory the
// driver stages the bytes before returning, so the source may be reused at
// once). Downloads copy with cuMemcpyDtoHAsync, wait for the stream and
// convert on the host. Pinned host tensors are read and written directly by
// the host after the stream has been synchronised.

// writeBytes copies b into t's bytes.
func (b *Backend) writeBytes(op string, t gpu.Tensor, src []byte) error {
	a, err := b.addr(op, "dst", t)
	if err != nil {
		return err
	}
	if int64(len(src)) != t.Bytes() {
		return fmt.Errorf("%s: %d bytes for a %d-byte tensor", op, len(src), t.Bytes())
	}
	if len(src) == 0 {
		return nil
	}
	s, err := b.stream()
	if err != nil {
		return err
	}
	if pm, ok := t.Mem.(*PinnedMemory); ok {
		if err := b.d.do(func() error { return cuErr("cuStreamSynchronize", C.cuStreamSynchronize_(s.h)) }); err != nil {
			return err
		}
		copy(pm.HostBytes()[t.Off:t.Off+t.Bytes()], src)
		return nil
	}
	return b.d.do(func() error {
		return cuErr("cuMemcpyHtoDAsync", C.cuMemcpyHtoDAsync_(C.CUdeviceptr(a), hostPtr(src), C.size_t(len(src)), C.uint64_t(s.h)))
	})
}

// readBytes copies t's bytes into dst after the stream's work completes.
func (b *Backend) readBytes(op string, t gpu.Tensor, dst []byte) error {
	a, err := b.addr(op, "src", t)
	if err != nil {
		return err
	}
	if int64(len(dst)) != t.Bytes() {
		return fmt.Errorf("%s: %d bytes for a %d-byte tensor", op, len(dst), t.Bytes())
	}
	s, err := b.stream()
	if err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	pm, pinned := t.Mem.(*PinnedMemory)
	err = b.d.do(func() error {
		if !pinned {
			if err := cuErr("cuMemcpyDtoHAsync", C.cuMemcpyDtoHAsync_(hostPtr(dst), C.CUdeviceptr(a), C.size_t(len(dst)), C.uint64_t(s.h))); err != nil {
				return err
			}
		}
		return cuErr("cuStreamSynchronize", C.cuStreamSynchronize_(s.h))
	})
	if err != nil {
		return err
	}
	if pinned {
		copy(dst, pm.HostBytes()[t.Off:t.Off+t.Bytes()])
	}
	return nil
}

// xferChunk bounds, in elements, the host staging of a transfer that
// converts dtypes: a large tensor moves in pieces through one buffer of at
// most 2^22 elements instead of a host copy of its whole size. float32
// moves with no staging at all.
const xferChunk = 1 << 22

// f32Bytes views a float32 slice as its bytes.
func f32Bytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))
}

// Upload converts src to dst's dtype and writes it.
func (b *Backend) Upload(dst gpu.Tensor, src []float32) error {
	if len(src) != dst.Numel() {
		return fmt.Errorf("upload: %d values for %d elements", len(src), dst.Numel())
	}
	if !dst.DType.Valid() {
		return fmt.Errorf("upload: dst has invalid dtype %v", dst.DType)
	}
	if dst.DType == gpu.F32 {
		return b.writeBytes("upload", dst, f32Bytes(src))
	}
	size := dst.DType.Size()
	buf := make([]byte, min(len(src), xferChunk)*size)
	for lo := 0; lo < len(src); lo += xferChunk {
		hi := min(lo+xferChunk, len(src))
		part, err := dst.Flat(lo, hi)
		if err != nil {
			return fmt.Errorf("upload: %w", err)
		}
		staged := buf[:(hi-lo)*size]
		if err := gpu.EncodeF32(staged, src[lo:hi], dst.DType); err != nil {
			return fmt.Errorf("upload: %w", err)
		}
		if err := b.writeBytes("upload", part, staged); err != nil {
			return err
		}
	}
	return nil
}

// UploadI32 writes src into an I32 tensor.
func (b *Backend) UploadI32(dst gpu.Tensor, src []int32) error {
	if dst.DType != gpu.I32 {
		return fmt.Errorf("upload: dst must be i32, got %v", dst.DType)
	}
	if len(src) != dst.Numel() {
		return fmt.Errorf("upload: %d values for %d elements", len(src), dst.Numel())
	}
	buf := make([]byte, 4*len(src))
	for i, v := range src {
		u := uint32(v)
		buf[4*i], buf[4*i+1], buf[4*i+2], buf[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	}
	return b.writeBytes("upload", dst, buf)
}

// UploadBytes writes raw little-endian bytes.
func (b *Backend) UploadBytes(dst gpu.Tensor, src []byte) error {
	return b.writeBytes("upload", dst, src)
}

// Download converts src to float32 into dst.
func (b *Backend) Download(dst []float32, src gpu.Tensor) error {
	if len(dst) != src.Numel() {
		return fmt.Errorf("download: %d values for %d elements", len(dst), src.Numel())
	}
	if !src.DType.Valid() {
		return fmt.Errorf("download: src has invalid dtype %v", src.DType)
	}
	if src.DType == gpu.F32 {
		return b.readBytes("download", src, f32Bytes(dst))
	}
	size := src.DType.Size()
	buf := make([]byte, min(len(dst), xferChunk)*size)
	for lo := 0; lo < len(dst); lo += xferChunk {
		hi := min(lo+xferChunk, len(dst))
		part, err := src.Flat(lo, hi)
		if err != nil {
			return fmt.Errorf("download: %w", err)
		}
		staged := buf[:(hi-lo)*size]
		if err := b.readBytes("download", part, staged); err != nil {
			return err
		}
		if err := gpu.DecodeF32(dst[lo:hi], staged, src.DType); err != nil {
			return err
		}
	}
	return nil
}

// DownloadI32 reads an I32 tensor.
func (b *Backend) DownloadI32(dst []int32, src gpu.Tensor) error {
	if src.DType != gpu.I32 {
		return fmt.Errorf("download: src must be i32, got %v", src.DType)
	}
	if len(dst) != src.Numel() {
		return fmt.Errorf("download: %d values for %d elements", len(dst), src.Numel())
	}
	buf := make([]byte, src.Bytes())
	if err := b.readBytes("download", src, buf); err != nil {
		return err
	}
	for i := range dst {
		dst[i] = int32(uint32(buf[4*i]) | uint32(buf[4*i+1])<<8 | uint32(buf[4*i+2])<<16 | uint32(buf[4*i+3])<<24)
	}
	return nil
}

// DownloadBytes reads raw bytes.
func (b *Backend) DownloadBytes(dst []byte, src gpu.Tensor) error {
	return b.readBytes("download", src, dst)
}

// isOwn reports whether m was allocated by this backend.
func (b *Backend) isOwn(m gpu.Memory) bool {
	switch x := m.(type) {
	case *DeviceMemory:
		return x.d == b.d
	case *PinnedMemory:
		return x.d == b.d
	}
	return false
}

// Copy copies src into dst with a dtype cast. Same-dtype copies are one
// cuMemcpyAsync (device or pinned memory on either side, through unified
// addressing); casts run the cast kernel, which reads and writes pinned host
// memory directly over the bus when one side is pinned. Host memory of
// another backend (gpu.HostMemory) is accepted on one side for same-dtype
// copies (a synchronous upload or download).
func (b *Backend) Copy(dst, src gpu.Tensor) error {
	const op = "copy"
	if dst.Numel() != src.Numel() {
		return fmt.Errorf("copy: dst %v and src %v differ in element count", dst.Shape, src.Shape)
	}
	if err := aliasOK(op, "dst", "src", dst, src); err != nil {
		return err
	}
	if src.Mem != nil && dst.Mem != nil && !b.isOwn(src.Mem) && b.isOwn(dst.Mem) {
		if src.DType != dst.DType {
			return fmt.Errorf("copy: casting from %T memory is not supported; copy same dtypes", src.Mem)
		}
		bs, err := src.HostBytes()
		if err != nil {
			return fmt.Errorf("copy: src: %w", err)
		}
		return b.writeBytes(op, dst, bs)
	}
	if src.Mem != nil && dst.Mem != nil && b.isOwn(src.Mem) && !b.isOwn(dst.Mem) {
		if src.DType != dst.DType {
			return fmt.Errorf("copy: casting into %T memory is not supported; copy same dtypes", dst.Mem)
		}
		bd, err := dst.HostBytes()
		if err != nil {
			return fmt.Errorf("copy: dst: %w", err)
		}
		return b.readBytes(op, src, bd)
	}
	da, err := b.addr(op, "dst", dst)
	if err != nil {
		return err
	}
	sa, err := b.addr(op, "src", src)
	if err != nil {
		return err
	}
	n := int64(dst.Numel())
	if n == 0 || same(dst, src) {
		return nil
	}
	s, err := b.stream()
	if err != nil {
		return err
	}
	if dst.DType == src.DType {
		return b.d.do(func() error {
			return cuErr("cuMemcpyAsync", C.cuMemcpyAsync_(C.CUdeviceptr(da), C.CUdeviceptr(sa), C.size_t(dst.Bytes()), C.uint64_t(s.h)))
		})
	}
	args := new(kargs).u64(da).dt(dst.DType).u64(sa).dt(src.DType).i64(n)
	if dst.DType.IsFloat() && src.DType.IsFloat() {
		return b.issue(b.flat("k_cast", n, []uint64{da, sa}, args))
	}
	return b.issue(b.flat1("k_cast", n, args))
}

// fillBits fills n 16- or 32-bit words at a with v.
func (b *Backend) fillBits(a uint64, n int64, bits int, v uint32) error {
	name := "k_fill32"
	if bits == 16 {
		name = "k_fill16"
	}
	return b.issue(launch{name: name, gx: b.d.gridFor(n), gy: 1, gz: 1, bx: 256, by: 1, bz: 1,
		args: new(kargs).u64(a).i64(n).put([]byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)})})
}

// Fill sets every element of dst to v (rounded to dst's dtype).
func (b *Backend) Fill(dst gpu.Tensor, v float32) error {
	a, err := b.addr("fill", "dst", dst)
	if err != nil {
		return err
	}
	n := int64(dst.Numel())
	switch dst.DType {
	case gpu.F32:
		return b.fillBits(a, n, 32, math.Float32bits(v))
	case gpu.I32:
		return b.fillBits(a, n, 32, uint32(gpu.F32ToI32(v)))
	case gpu.BF16:
		return b.fillBits(a, n, 16, uint32(gpu.BF16FromF32(v)))
	}
	return b.fillBits(a, n, 16, uint32(gpu.F16FromF32(v)))
}

// Zero sets every byte of dst to zero.
func (b *Backend) Zero(dst gpu.Tensor) error {
	a, err := b.addr("zero", "dst", dst)
	if err != nil {
		return err
	}
	if dst.Bytes()%4 == 0 && a%4 == 0 {
		return b.fillBits(a, dst.Bytes()/4, 32, 0)
	}
	return b.fillBits(a, dst.Bytes()/2, 16, 0)
}
