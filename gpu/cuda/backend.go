//go:build cgo

package cuda

/*
#include <stdlib.h>
#include "rlcuda.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/rlpipe/rlpipe/gpu"
)

const (
	// workspaceBytes is the cuBLASLt workspace, part of the backend's one
	// internal device allocation (the memory plan reserves the same 32 MiB
	// as "cublas.workspace").
	workspaceBytes = 32 << 20
	// flagBytes holds the device error flag at the end of the internal
	// allocation.
	flagBytes = 256
	// streamScratchBytes is each stream's own device buffer for reduction
	// partials (SumSquares, RMSNorm's weight gradient, BiasGrad) and the
	// attention backward's block orders. The memory plan's backend reserve
	// counts it for two streams.
	streamScratchBytes = 4 << 20
	// tileCounterBytes at the end of each stream's scratch hold the tile
	// counter of the persistent products (kernels/hopper.cuh's tile queue),
	// which nothing else writes; scratchUsable is the rest.
	tileCounterBytes = 256
	scratchUsable    = streamScratchBytes - tileCounterBytes
	// tileQueueBytes is the tile queue's shared memory in each persistent
	// product: hopper.cuh's TQ_N slots, two mbarriers and an int each
	// (TestTileQueueBytes reads TQ_N from the source).
	tileQueueBytes = 4 * (2*8 + 4)
	// sumPartials is the number of per-block partial sums SumSquares uses.
	sumPartials = 1024
)

var errClosed = errors.New("cuda: backend is closed")

// device is the state shared by a Backend and its stream views. Every CUDA
// call for it runs on one goroutine locked to an OS thread (the worker),
// which holds the device's primary context current.
type device struct {
	info     DeviceInfo
	cudev    C.CUdevice
	ctx      C.uint64_t
	smemMax  int
	jobs     chan func()
	quit     chan struct{}
	closeMu  sync.Mutex
	closed   bool
	mods     []C.uint64_t
	fns      map[string]C.uint64_t
	dynSmem  map[string]int // each kernel's dynamic shared memory ceiling
	lt       C.uint64_t
	internal C.CUdeviceptr // workspace followed by the error flag
	flag     uint64
	algos    map[ltKey]C.rlLtAlgo
	def      *Stream
	streams  map[*Stream]bool      // every live stream, for their scratch (worker only)
	released bool                  // the workspace and scratch are released (worker only)
	spans    spanCache             // span layouts of ring attention
	tmaps    map[tmapKey][128]byte // encoded tensor maps (worker only)
	occMu    sync.Mutex
	occ      map[occKey]int // resident blocks an SM, by kernel and block size
}

// occKey names a kernel launched with blocks of threads threads and no
// dynamic shared memory.
type occKey struct {
	name    string
	threads uint32
}

// resident returns how many blocks of threads threads of kernel name an SM
// holds at once (the driver's occupancy calculation: registers, shared
// memory, threads); none is an error, as such a block cannot launch. Grids that split a fixed amount of work
// over their blocks ahead of time take one wave of that many blocks an
// SM, so that no SM runs a second, partial wave alone.
func (d *device) resident(name string, threads uint32) (int, error) {
	k := occKey{name, threads}
	d.occMu.Lock()
	n, ok := d.occ[k]
	d.occMu.Unlock()
	if ok {
		return n, nil
	}
	err := d.do(func() error {
		fn, ok := d.fns[name]
		if !ok {
			return fmt.Errorf("cuda: no kernel %s", name)
		}
		var v C.int
		if err := cuErr("cuOccupancyMaxActiveBlocksPerMultiprocessor "+name, C.cuOccupancy_(&v, fn, C.int(threads), 0)); err != nil {
			return err
		}
		if v < 1 {
			return fmt.Errorf("cuda: kernel %s cannot run blocks of %d threads", name, threads)
		}
		n = int(v)
		return nil
	})
	if err != nil {
		return 0, err
	}
	d.occMu.Lock()
	d.occ[k] = n
	d.occMu.Unlock()
	return n, nil
}

// do runs f on the device's worker goroutine and waits for it.
func (d *device) do(f func() error) error {
	ch := make(chan error, 1)
	select {
	case d.jobs <- func() { ch <- f() }:
	case <-d.quit:
		return errClosed
	}
	return <-ch
}

func (d *device) worker(ready chan<- error) {
	runtime.LockOSThread()
	var ctx C.uint64_t
	err := cuErr("cuDevicePrimaryCtxRetain", C.cuDevicePrimaryCtxRetain_(&ctx, d.cudev))
	if err == nil {
		err = cuErr("cuCtxSetCurrent", C.cuCtxSetCurrent_(ctx))
	}
	d.ctx = ctx
	ready <- err
	if err != nil {
		return
	}
	for {
		select {
		case f := <-d.jobs:
			f()
		case <-d.quit:
			return
		}
	}
}

// Backend is the CUDA implementation of gpu.Backend for one device. Ops are
// issued asynchronously on the backend's stream (see On); Sync, stream and
// event syncs, downloads and SumSquares wait for the device.
//
// Errors that only the device can see (an embedding id or log-prob target
// outside its range, malformed cuSeqlens) cannot be returned by the op that
// issues the work: the kernels skip the bad rows (zero or NaN output) and
// raise a device flag that the next Sync (of the backend or of any of its
// streams) reports as an error.
type Backend struct {
	d *device
	s *Stream
}

var _ gpu.Backend = (*Backend)(nil)

// New creates a backend on device ordinal dev: it loads the driver, NVRTC
// and cuBLASLt, compiles the kernels for the device (or loads them from the
// disk cache), and makes the backend's one internal device allocation (the
// 32 MiB cuBLASLt workspace and a device error flag) and its default stream.
// Without a usable driver it returns an error wrapping ErrNoDriver.
func New(dev int) (*Backend, error) {
	if err := initDriver(); err != nil {
		return nil, err
	}
	if err := load(libNVRTC); err != nil {
		return nil, err
	}
	if err := load(libCublasLt); err != nil {
		return nil, err
	}
	var n C.int
	if err := cuErr("cuDeviceGetCount", C.cuDeviceGetCount_(&n)); err != nil {
		return nil, err
	}
	if dev < 0 || dev >= int(n) {
		return nil, fmt.Errorf("cuda: device %d does not exist (%d devices)", dev, int(n))
	}
	info, cudev, err := deviceInfo(dev)
	if err != nil {
		return nil, err
	}
	mods, imgs, err := compileAll(info.Arch(), false)
	if err != nil {
		return nil, err
	}
	d := &device{info: info, cudev: cudev, jobs: make(chan func()), quit: make(chan struct{}),
		fns: map[string]C.uint64_t{}, dynSmem: map[string]int{}, algos: map[ltKey]C.rlLtAlgo{}, occ: map[occKey]int{}}
	ready := make(chan error)
	go d.worker(ready)
	if err := <-ready; err != nil {
		close(d.quit)
		return nil, err
	}
	b := &Backend{d: d}
	err = d.do(func() error { return d.setup(mods, imgs) })
	if err != nil {
		_ = b.Close()
		return nil, err
	}
	b.s = d.def
	return b, nil
}

// setup runs on the worker: modules, cuBLASLt, internal memory, stream.
func (d *device) setup(mods []kernelModule, imgs []kernelImage) error {
	var v C.int
	if err := cuErr("cuDeviceGetAttribute", C.cuDeviceGetAttribute_(&v, attrSmemOptin, d.cudev)); err != nil {
		return err
	}
	d.smemMax = int(v)
	if err := cuErr("cuDeviceGetAttribute", C.cuDeviceGetAttribute_(&v, attrUnifiedAddressing, d.cudev)); err != nil {
		return err
	}
	if v == 0 {
		return fmt.Errorf("cuda: device %d lacks unified addressing", d.info.Index)
	}
	for i, m := range mods {
		img := imgs[i].data
		if imgs[i].ptx {
			img = append(append([]byte(nil), img...), 0)
		}
		var mod C.uint64_t
		if err := cuErr("cuModuleLoadData "+m.name, C.cuModuleLoadData_(&mod, unsafe.Pointer(&img[0]))); err != nil {
			return err
		}
		d.mods = append(d.mods, mod)
		for _, f := range m.funcs {
			cs := C.CString(f)
			var fn C.uint64_t
			err := cuErr("cuModuleGetFunction "+f, C.cuModuleGetFunction_(&fn, mod, cs))
			C.free(unsafe.Pointer(cs))
			if err != nil {
				return err
			}
			// Every kernel may ask for the opt-in limit of dynamic shared
			// memory (the Hopper kernels of attention.cu and gemm.cu
			// need more than the default 48 KB). A kernel's static shared
			// memory counts against that limit, so its dynamic ceiling is
			// what is left.
			var static C.int
			if err := cuErr("cuFuncGetAttribute "+f, C.cuFuncGetAttribute_(&static, funcAttrStaticSmem, fn)); err != nil {
				return err
			}
			dyn := d.smemMax - int(static)
			if err := cuErr("cuFuncSetAttribute "+f, C.cuFuncSetAttribute_(fn, funcAttrMaxDynSmem, C.int(dyn))); err != nil {
				return err
			}
			d.dynSmem[f] = dyn
			d.fns[f] = fn
		}
	}
	if st := C.ltCreate_(&d.lt); st != 0 {
		return ltErr("cublasLtCreate", st)
	}
	if err := cuErr("cuMemAlloc (internal workspace)", C.cuMemAlloc_(&d.internal, workspaceBytes+flagBytes)); err != nil {
		return err
	}
	d.flag = uint64(d.internal) + workspaceBytes
	if err := d.memsetFlag(); err != nil {
		return err
	}
	s, err := d.newStream(true, false)
	if err != nil {
		return err
	}
	d.def = s
	return nil
}

func ltErr(op string, st C.cublasStatus_t) error {
	return fmt.Errorf("cuda: %s: %s (%d)", op, C.GoString(C.ltStatusText(st)), int(st))
}

// memsetFlag zeroes the device error flag (worker only).
func (d *device) memsetFlag() error { return zero4(d.flag, "error flag") }

// zero4 zeroes the 4 bytes at device address a (what names them) and
// waits for it (worker only).
func zero4(a uint64, what string) error {
	var z [4]byte
	if err := cuErr("cuMemcpyHtoD ("+what+")", C.cuMemcpyHtoDAsync_(C.CUdeviceptr(a), unsafe.Pointer(&z[0]), 4, 0)); err != nil {
		return err
	}
	return cuErr("cuCtxSynchronize", C.cuCtxSynchronize_())
}

// checkFlag reads and clears the device error flag after a sync (worker
// only).
func (d *device) checkFlag() error {
	if d.released {
		return nil // no kernel runs while released
	}
	var f [4]byte
	if err := cuErr("cuMemcpyDtoH (error flag)", C.cuMemcpyDtoHAsync_(unsafe.Pointer(&f[0]), C.CUdeviceptr(d.flag), 4, 0)); err != nil {
		return err
	}
	if err := cuErr("cuCtxSynchronize", C.cuCtxSynchronize_()); err != nil {
		return err
	}
	v := uint32(f[0]) | uint32(f[1])<<8 | uint32(f[2])<<16 | uint32(f[3])<<24
	if v == 0 {
		return nil
	}
	if err := d.memsetFlag(); err != nil {
		return err
	}
	var msgs []string
	if v&1 != 0 {
		msgs = append(msgs, "embedding: an id is outside [0,V)")
	}
	if v&2 != 0 {
		msgs = append(msgs, "embedding backward: an id is outside [0,V)")
	}
	if v&4 != 0 {
		msgs = append(msgs, "logprobs: a target is outside [0,V)")
	}
	if v&8 != 0 {
		msgs = append(msgs, "attention: cuSeqlens must start at 0, end at T and not decrease")
	}
	if v&16 != 0 {
		msgs = append(msgs, "copy rows: a row is outside [0,V)")
	}
	return fmt.Errorf("cuda: device reported bad inputs since the last sync: %v", msgs)
}

// Close releases the backend's device resources: streams it created,
// modules, the cuBLASLt handle, the internal allocation and the primary
// context reference. Memory from Alloc and AllocHost must be freed first.
// Views from On share the device and must not be used afterwards.
func (b *Backend) Close() error {
	d := b.d
	d.closeMu.Lock()
	if d.closed {
		d.closeMu.Unlock()
		return nil
	}
	d.closeMu.Unlock()
	spanErr := b.freeSpans()
	d.closeMu.Lock()
	d.closed = true
	d.closeMu.Unlock()
	err := d.do(func() error {
		var errs []error
		errs = append(errs, cuErr("cuCtxSynchronize", C.cuCtxSynchronize_()))
		if d.def != nil {
			errs = append(errs, d.def.destroy())
		}
		if d.lt != 0 {
			if st := C.ltDestroy_(d.lt); st != 0 {
				errs = append(errs, ltErr("cublasLtDestroy", st))
			}
		}
		if d.internal != 0 {
			errs = append(errs, cuErr("cuMemFree", C.cuMemFree_(d.internal)))
		}
		for _, m := range d.mods {
			errs = append(errs, cuErr("cuModuleUnload", C.cuModuleUnload_(m)))
		}
		if d.ctx != 0 {
			errs = append(errs, cuErr("cuDevicePrimaryCtxRelease", C.cuDevicePrimaryCtxRelease_(d.cudev)))
		}
		return errors.Join(errs...)
	})
	close(d.quit)
	return errors.Join(spanErr, err)
}

// Name returns "cuda:N".
func (b *Backend) Name() string { return fmt.Sprintf("cuda:%d", b.d.info.Index) }

// Device returns what the driver reports about the backend's device.
func (b *Backend) Device() DeviceInfo { return b.d.info }

// DeviceMemory is device memory from Alloc. It is not host-addressable.
type DeviceMemory struct {
	d        *device
	ptr      uint64
	size     int64
	released bool // by Release: size kept, no memory until Reacquire
}

// Size returns the size in bytes.
func (m *DeviceMemory) Size() int64 { return m.size }

// DevicePtr returns the device address of the block.
func (m *DeviceMemory) DevicePtr() uint64 { return m.ptr }

// PinnedMemory is page-locked host memory from AllocHost. It implements
// gpu.HostMemory; with unified addressing the device reaches it at the same
// address, so kernels (casting copies) read and write it directly.
type PinnedMemory struct {
	d    *device
	p    unsafe.Pointer
	size int64
}

// Size returns the size in bytes.
func (m *PinnedMemory) Size() int64 { return m.size }

// HostBytes returns the block's bytes.
func (m *PinnedMemory) HostBytes() []byte {
	if m.p == nil {
		return []byte{}
	}
	return unsafe.Slice((*byte)(m.p), m.size)
}

// Alloc allocates device memory with cuMemAlloc (contents undefined).
func (b *Backend) Alloc(bytes int64) (gpu.Memory, error) {
	if bytes < 0 || bytes > 1<<48 {
		return nil, fmt.Errorf("alloc: bad size %d", bytes)
	}
	m := &DeviceMemory{d: b.d, size: bytes}
	if bytes == 0 {
		return m, nil
	}
	err := b.d.do(func() error {
		var p C.CUdeviceptr
		if err := cuErr(fmt.Sprintf("cuMemAlloc(%d bytes)", bytes), C.cuMemAlloc_(&p, C.size_t(bytes))); err != nil {
			return err
		}
		m.ptr = uint64(p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("alloc: %w", err)
	}
	return m, nil
}

// AllocHost allocates pinned host memory with cuMemAllocHost.
func (b *Backend) AllocHost(bytes int64) (gpu.Memory, error) {
	if bytes < 0 || bytes > 1<<48 {
		return nil, fmt.Errorf("alloc host: bad size %d", bytes)
	}
	m := &PinnedMemory{d: b.d, size: bytes}
	if bytes == 0 {
		return m, nil
	}
	err := b.d.do(func() error {
		var p unsafe.Pointer
		if err := cuErr(fmt.Sprintf("cuMemAllocHost(%d bytes)", bytes), C.cuMemAllocHost_(&p, C.size_t(bytes))); err != nil {
			return err
		}
		m.p = p
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("alloc host: %w", err)
	}
	return m, nil
}

// Free releases memory from Alloc or AllocHost after the device has
// finished all work issued so far.
func (b *Backend) Free(m gpu.Memory) error {
	switch x := m.(type) {
	case *DeviceMemory:
		if x.d != b.d {
			return fmt.Errorf("free: memory belongs to another backend")
		}
		if x.ptr == 0 {
			return nil
		}
		p := x.ptr
		x.ptr, x.size = 0, 0
		return b.d.do(func() error {
			if err := cuErr("cuCtxSynchronize", C.cuCtxSynchronize_()); err != nil {
				return err
			}
			return cuErr("cuMemFree", C.cuMemFree_(C.CUdeviceptr(p)))
		})
	case *PinnedMemory:
		if x.d != b.d {
			return fmt.Errorf("free: memory belongs to another backend")
		}
		if x.p == nil {
			return nil
		}
		p := x.p
		x.p, x.size = nil, 0
		return b.d.do(func() error {
			if err := cuErr("cuCtxSynchronize", C.cuCtxSynchronize_()); err != nil {
				return err
			}
			return cuErr("cuMemFreeHost", C.cuMemFreeHost_(p))
		})
	}
	return fmt.Errorf("free: memory %T was not allocated by the cuda backend", m)
}

// Stream is a CUDA stream (created non-blocking). Each stream owns a small
// device buffer for reduction partials. Only the backend's default stream
// gives cuBLASLt the 32 MiB workspace; products issued on other streams run
// without one, so two streams never share it.
type Stream struct {
	d         *device
	h         C.uint64_t
	scratch   C.CUdeviceptr
	workspace bool
}

// Event is a CUDA event (timing disabled, except from RecordTimed).
type Event struct {
	d *device
	h C.uint64_t
}

// newStream creates a non-blocking stream, with the device's greatest
// priority when high is set (the driver clamps the priority asked for to
// its range).
func (d *device) newStream(workspace, high bool) (*Stream, error) {
	s := &Stream{d: d, workspace: workspace}
	if high {
		if err := cuErr("cuStreamCreateWithPriority", C.cuStreamCreateWithPriority_(&s.h, streamNonBlocking, -1<<20)); err != nil {
			return nil, err
		}
	} else if err := cuErr("cuStreamCreate", C.cuStreamCreate_(&s.h, streamNonBlocking)); err != nil {
		return nil, err
	}
	if !d.released {
		if err := cuErr("cuMemAlloc (stream scratch)", C.cuMemAlloc_(&s.scratch, streamScratchBytes)); err != nil {
			C.cuStreamDestroy_(s.h)
			return nil, err
		}
		if err := s.zeroTileCounter(); err != nil {
			C.cuMemFree_(s.scratch)
			C.cuStreamDestroy_(s.h)
			return nil, err
		}
	}
	if d.streams == nil {
		d.streams = map[*Stream]bool{}
	}
	d.streams[s] = true
	return s, nil
}

// tileCounter is the device address of the stream's tile counter.
func (s *Stream) tileCounter() uint64 { return uint64(s.scratch) + scratchUsable }

// zeroTileCounter zeroes the stream's tile counter before its first
// persistent product; each launch leaves it zero for the next (worker
// only).
func (s *Stream) zeroTileCounter() error { return zero4(s.tileCounter(), "tile counter") }

// destroy releases the stream (worker only).
func (s *Stream) destroy() error {
	var errs []error
	if s.h != 0 {
		errs = append(errs, cuErr("cuStreamSynchronize", C.cuStreamSynchronize_(s.h)))
		errs = append(errs, cuErr("cuStreamDestroy", C.cuStreamDestroy_(s.h)))
		s.h = 0
	}
	if s.scratch != 0 {
		errs = append(errs, cuErr("cuMemFree", C.cuMemFree_(s.scratch)))
		s.scratch = 0
	}
	delete(s.d.streams, s)
	return errors.Join(errs...)
}

// Sync waits for the stream's work and reports device-detected input errors.
func (s *Stream) Sync() error {
	return s.d.do(func() error {
		if err := cuErr("cuStreamSynchronize", C.cuStreamSynchronize_(s.h)); err != nil {
			return err
		}
		return s.d.checkFlag()
	})
}

// Record returns an event that completes with the work issued so far.
func (s *Stream) Record() (gpu.Event, error) {
	e := &Event{d: s.d}
	err := s.d.do(func() error {
		if err := cuErr("cuEventCreate", C.cuEventCreate_(&e.h, eventDisableTiming)); err != nil {
			return err
		}
		return cuErr("cuEventRecord", C.cuEventRecord_(e.h, s.h))
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// RecordTimed returns an event that completes with the work issued so far
// and keeps the time it completed at (Event.Since): a timeline's mark.
func (s *Stream) RecordTimed() (gpu.Event, error) {
	e := &Event{d: s.d}
	err := s.d.do(func() error {
		if err := cuErr("cuEventCreate", C.cuEventCreate_(&e.h, 0)); err != nil {
			return err
		}
		return cuErr("cuEventRecord", C.cuEventRecord_(e.h, s.h))
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Since returns the time from start's completion to e's; both must come
// from RecordTimed on this device and have completed.
func (e *Event) Since(start gpu.Event) (time.Duration, error) {
	st, ok := start.(*Event)
	if !ok || st.d != e.d {
		return 0, fmt.Errorf("cuda: since: event %T is not from this device", start)
	}
	var ms C.float
	err := e.d.do(func() error { return cuErr("cuEventElapsedTime", C.cuEventElapsedTime_(&ms, st.h, e.h)) })
	return time.Duration(float64(ms) * float64(time.Millisecond)), err
}

// Wait makes later work on s wait for e.
func (s *Stream) Wait(e gpu.Event) error {
	ev, ok := e.(*Event)
	if !ok || ev.d != s.d {
		return fmt.Errorf("cuda: wait: event %T is not from this device", e)
	}
	return s.d.do(func() error { return cuErr("cuStreamWaitEvent", C.cuStreamWaitEvent_(s.h, ev.h)) })
}

// Close destroys the stream after its work completes. The default stream is
// closed by Backend.Close.
func (s *Stream) Close() error {
	if s == s.d.def {
		return nil
	}
	return s.d.do(s.destroy)
}

// Sync waits for the event.
func (e *Event) Sync() error {
	return e.d.do(func() error { return cuErr("cuEventSynchronize", C.cuEventSynchronize_(e.h)) })
}

// Query reports whether the event has completed, without waiting: a
// goroutine that must not hold the device's driver thread while it waits
// (Sync does) polls it.
func (e *Event) Query() (bool, error) {
	var done bool
	err := e.d.do(func() error {
		switch r := C.cuEventQuery_(e.h); r {
		case 0:
			done = true
			return nil
		case cudaErrorNotReady:
			return nil
		default:
			return cuErr("cuEventQuery", r)
		}
	})
	return done, err
}

// Close releases the event.
func (e *Event) Close() error {
	return e.d.do(func() error {
		if e.h == 0 {
			return nil
		}
		err := cuErr("cuEventDestroy", C.cuEventDestroy_(e.h))
		e.h = 0
		return err
	})
}

// sidePriority gives the streams NewStream creates (the side stream units
// are gathered on, and grads reduced on with overlap_reduce) the device's
// greatest priority, so that their NCCL kernels are scheduled ahead of the
// compute stream's blocks (PyTorch FSDP2 creates its all-gather and
// reduce-scatter streams at a high priority too). On four H200s at dp 4
// it made the train step 0.8% (1.5B) and 1.5% (3B) faster
// (bench/results/2026-11-27-h200x4-cp-wgmma/overlap);
// RLPIPE_CUDA_SIDE_PRIORITY=0 turns it off.
var sidePriority = os.Getenv("RLPIPE_CUDA_SIDE_PRIORITY") != "0"

// NewStream creates a stream (with sidePriority, of the greatest priority).
func (b *Backend) NewStream() (gpu.Stream, error) {
	var s *Stream
	err := b.d.do(func() error {
		var err error
		s, err = b.d.newStream(false, sidePriority)
		return err
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// DefaultStream returns the backend's default stream (a created stream, not
// the legacy NULL stream).
func (b *Backend) DefaultStream() gpu.Stream { return b.d.def }

// On returns a view of the backend that issues on s (a stream of this
// backend; anything else yields a view whose ops fail).
func (b *Backend) On(s gpu.Stream) gpu.Backend {
	cs, ok := s.(*Stream)
	if !ok || cs.d != b.d {
		return &Backend{d: b.d, s: &Stream{d: b.d}}
	}
	return &Backend{d: b.d, s: cs}
}

// Sync waits for all work on the device and reports device-detected input
// errors.
func (b *Backend) Sync() error {
	return b.d.do(func() error {
		if err := cuErr("cuCtxSynchronize", C.cuCtxSynchronize_()); err != nil {
			return err
		}
		return b.d.checkFlag()
	})
}

// stream returns the view's stream handle or an error for a foreign stream.
func (b *Backend) stream() (*Stream, error) {
	if b.s == nil || b.s.h == 0 {
		return nil, fmt.Errorf("cuda: stream is closed or not from this backend")
	}
	return b.s, nil
}

// kargs packs kernel parameters: each is stored at its own offset of one
// byte buffer (which holds no Go pointers) and the C side passes
// cuLaunchKernel a pointer to each.
type kargs struct {
	buf  []byte
	offs []C.int
}

func (a *kargs) put(b []byte) *kargs {
	for len(a.buf)%8 != 0 {
		a.buf = append(a.buf, 0)
	}
	a.offs = append(a.offs, C.int(len(a.buf)))
	a.buf = append(a.buf, b...)
	return a
}

func (a *kargs) u64(v uint64) *kargs {
	var b [8]byte
	for i := range b {
		b[i] = byte(v >> (8 * i))
	}
	return a.put(b[:])
}

func (a *kargs) i64(v int64) *kargs { return a.u64(uint64(v)) }

func (a *kargs) i32(v int) *kargs {
	u := uint32(int32(v))
	return a.put([]byte{byte(u), byte(u >> 8), byte(u >> 16), byte(u >> 24)})
}

func (a *kargs) f32(v float32) *kargs {
	u := math.Float32bits(v)
	return a.put([]byte{byte(u), byte(u >> 8), byte(u >> 16), byte(u >> 24)})
}

// dt appends a dtype code (the gpu.DType value).
func (a *kargs) dt(d gpu.DType) *kargs { return a.i32(int(d)) }

// launch is one kernel launch: grid, block, dynamic shared memory.
type launch struct {
	name       string
	gx, gy, gz uint32
	bx, by, bz uint32
	smem       int
	args       *kargs
}

// run issues the launches in order on s (worker only).
func (d *device) run(s *Stream, ls ...launch) error {
	if d.released {
		return errReleased
	}
	for _, l := range ls {
		if l.gx == 0 || l.gy == 0 || l.gz == 0 {
			continue
		}
		fn, ok := d.fns[l.name]
		if !ok {
			return fmt.Errorf("cuda: kernel %s is not loaded", l.name)
		}
		if limit := d.dynSmem[l.name]; l.smem > limit {
			return fmt.Errorf("cuda: kernel %s needs %d bytes of dynamic shared memory, the device allows it %d", l.name, l.smem, limit)
		}
		var buf *C.char
		if len(l.args.buf) > 0 {
			buf = (*C.char)(unsafe.Pointer(&l.args.buf[0]))
		}
		var offs *C.int
		if len(l.args.offs) > 0 {
			offs = &l.args.offs[0]
		}
		r := C.rl_launch(fn, C.uint(l.gx), C.uint(l.gy), C.uint(l.gz), C.uint(l.bx), C.uint(l.by), C.uint(l.bz),
			C.uint(l.smem), s.h, buf, offs, C.int(len(l.args.offs)))
		if err := cuErr("launch "+l.name, r); err != nil {
			return err
		}
	}
	return nil
}

// issue runs the launches on the view's stream.
func (b *Backend) issue(ls ...launch) error {
	s, err := b.stream()
	if err != nil {
		return err
	}
	return b.d.do(func() error { return b.d.run(s, ls...) })
}

// gridFor returns a 1-D grid of 256-thread blocks for n elements, capped so
// that grid-stride loops cover the rest.
func (d *device) gridFor(n int64) uint32 {
	if n <= 0 {
		return 0
	}
	g := (n + 255) / 256
	lim := int64(max(d.info.SMs, 1)) * 32
	return uint32(max(min(g, lim), 1))
}

// rowGrid returns a grid of one block per row, capped at 2^18 blocks (the
// kernels loop over the rest); 0 rows launch nothing.
func rowGrid(rows int64) uint32 { return uint32(max(min(rows, 1<<18), 0)) }

// DevicePtr returns the device address of t's first element. t must be in
// this backend's device or pinned memory.
func (b *Backend) DevicePtr(t gpu.Tensor) (uint64, error) { return b.addr("device pointer", "t", t) }

// Enqueue runs f on the backend's device thread, with the device's context
// current, and passes it the handle of the view's stream (a CUstream, which
// is also a cudaStream_t). Libraries that launch their own work on CUDA
// streams (NCCL) use it, so that their work is ordered with the backend's
// ops on that stream. f must not block on other ranks' device threads.
func (b *Backend) Enqueue(f func(stream uintptr) error) error {
	s, err := b.stream()
	if err != nil {
		return err
	}
	return b.d.do(func() error { return f(uintptr(s.h)) })
}
