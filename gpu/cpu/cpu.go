// Package cpu is the pure-Go reference implementation of gpu.Backend. Memory
// is ordinary host memory, streams and events are no-ops (every op completes
// before it returns), and the heavy ops (GEMM, attention, log-probs) are
// split across runtime.GOMAXPROCS goroutines.
//
// Device memory comes only from Alloc, as the memory plan requires. Ops use
// bounded Go-heap scratch of their own for float32 conversion tiles: O(row)
// or O(tile) per worker goroutine (at most a few hundred KiB per call for
// realistic shapes), never O(tokens²) or O(tokens×vocab).
package cpu

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rlpipe/rlpipe/gpu"
)

// Memory is a block of host memory allocated by the CPU backend. It
// implements gpu.HostMemory. Its storage is 64-byte aligned.
type Memory struct {
	buf      []byte
	pinned   bool
	size     int64
	released bool // by Release: no storage until Reacquire
}

// Size returns the size of the block in bytes.
func (m *Memory) Size() int64 { return m.size }

// HostBytes returns the block's bytes.
func (m *Memory) HostBytes() []byte { return m.buf }

// Pinned reports whether the block came from AllocHost.
func (m *Memory) Pinned() bool { return m.pinned }

// Backend is the CPU implementation of gpu.Backend. It is safe for
// concurrent use by several goroutines on disjoint outputs.
type Backend struct {
	threads int
}

var _ gpu.Backend = (*Backend)(nil)

// New returns a CPU backend using runtime.GOMAXPROCS(0) worker goroutines.
func New() *Backend { return NewWithThreads(0) }

// NewWithThreads returns a CPU backend using n worker goroutines (n <= 0
// means runtime.GOMAXPROCS(0)).
func NewWithThreads(n int) *Backend {
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	return &Backend{threads: n}
}

// Name returns "cpu".
func (b *Backend) Name() string { return "cpu" }

// Alloc returns zeroed host memory.
func (b *Backend) Alloc(bytes int64) (gpu.Memory, error) { return alloc(bytes, false) }

// AllocHost returns zeroed host memory marked as pinned.
func (b *Backend) AllocHost(bytes int64) (gpu.Memory, error) { return alloc(bytes, true) }

func alloc(bytes int64, pinned bool) (*Memory, error) {
	if bytes < 0 || bytes > 1<<48 {
		return nil, fmt.Errorf("alloc: bad size %d", bytes)
	}
	// Allocate 64-byte words so every offset aligned in the plan is aligned
	// in memory too.
	words := make([]uint64, (bytes+63)/64*8+8)
	p := unsafe.Pointer(unsafe.SliceData(words))
	skip := (64 - uintptr(p)%64) % 64
	all := unsafe.Slice((*byte)(p), len(words)*8)
	return &Memory{buf: all[skip : skip+uintptr(bytes) : skip+uintptr(bytes)], pinned: pinned, size: bytes}, nil
}

// Release drops m's storage (the garbage collector reclaims it) and keeps
// m, with its size, so that Reacquire can give it storage again: views of m
// fail until then. It is how the CPU backend lets the trainer sleep.
func (b *Backend) Release(m gpu.Memory) error {
	cm, ok := m.(*Memory)
	if !ok {
		return fmt.Errorf("release: memory %T was not allocated by the cpu backend", m)
	}
	cm.buf, cm.released = nil, true
	return nil
}

// Reacquire gives m zeroed storage again after Release.
func (b *Backend) Reacquire(m gpu.Memory) error {
	cm, ok := m.(*Memory)
	if !ok {
		return fmt.Errorf("reacquire: memory %T was not allocated by the cpu backend", m)
	}
	if !cm.released {
		return nil
	}
	fresh, err := alloc(cm.size, cm.pinned)
	if err != nil {
		return err
	}
	cm.buf, cm.released = fresh.buf, false
	return nil
}

// Released reports whether m's storage was released.
func (m *Memory) Released() bool { return m.released }

// ReleaseWorkspace does nothing: the CPU backend has no workspace.
func (b *Backend) ReleaseWorkspace() error { return nil }

// ReacquireWorkspace does nothing.
func (b *Backend) ReacquireWorkspace() error { return nil }

// Free drops the backend's use of m; the Go garbage collector reclaims it.
func (b *Backend) Free(m gpu.Memory) error {
	if _, ok := m.(*Memory); !ok {
		return fmt.Errorf("free: memory %T was not allocated by the cpu backend", m)
	}
	return nil
}

type stream struct{}

type event struct{}

func (stream) Sync() error                { return nil }
func (stream) Record() (gpu.Event, error) { return event{}, nil }
func (stream) Wait(gpu.Event) error       { return nil }
func (stream) Close() error               { return nil }
func (event) Sync() error                 { return nil }
func (event) Close() error                { return nil }

// RecordTimed returns an event holding the time now: the CPU backend's
// ops have finished when they return, so that is when the stream's work
// so far completed.
func (stream) RecordTimed() (gpu.Event, error) { return timedEvent{time.Now()}, nil }

// timedEvent is a completed event and the time it completed at.
type timedEvent struct{ at time.Time }

func (timedEvent) Sync() error  { return nil }
func (timedEvent) Close() error { return nil }

// Since returns the time from start's completion to e's.
func (e timedEvent) Since(start gpu.Event) (time.Duration, error) {
	st, ok := start.(timedEvent)
	if !ok {
		return 0, fmt.Errorf("cpu: since: event %T is not a timed event of the cpu backend", start)
	}
	return e.at.Sub(st.at), nil
}

// NewStream returns a no-op stream.
func (b *Backend) NewStream() (gpu.Stream, error) { return stream{}, nil }

// DefaultStream returns the (no-op) default stream.
func (b *Backend) DefaultStream() gpu.Stream { return stream{} }

// On returns b: CPU work is synchronous, so all streams are the same.
func (b *Backend) On(gpu.Stream) gpu.Backend { return b }

// Sync returns nil: CPU work is complete when an op returns.
func (b *Backend) Sync() error { return nil }

// workers returns how many chunks parallel splits n items into.
func (b *Backend) workers(n, minChunk int) int {
	minChunk = max(minChunk, 1)
	return max(1, min(b.threads, (n+minChunk-1)/minChunk))
}

// parallel runs fn over [0,n) split into b.workers(n, minChunk) contiguous
// chunks, one goroutine each; w is the chunk's index.
func (b *Backend) parallel(n, minChunk int, fn func(w, lo, hi int)) {
	if n <= 0 {
		return
	}
	nw := b.workers(n, minChunk)
	if nw == 1 {
		fn(0, 0, n)
		return
	}
	var wg sync.WaitGroup
	for i := range nw {
		lo, hi := i*n/nw, (i+1)*n/nw
		wg.Go(func() { fn(i, lo, hi) })
	}
	wg.Wait()
}

// spans runs fn over [0,n) in spans of at most span items, handed out to
// b's workers dynamically: which worker takes a span does not change what
// fn computes over it.
func spans(b *Backend, n, span int, fn func(lo, hi int)) {
	tasks(b, (n+span-1)/span, func() struct{} { return struct{}{} }, func(_ struct{}, i int) {
		fn(i*span, min((i+1)*span, n))
	})
}

// tasks runs fn(worker, task) for every task in [0,n), handing tasks out
// dynamically to the workers; worker is in [0, workers) and lets fn reuse
// per-worker scratch returned by newScratch.
func tasks[S any](b *Backend, n int, newScratch func() S, fn func(s S, task int)) {
	if n <= 0 {
		return
	}
	w := min(b.threads, n)
	if w <= 1 {
		s := newScratch()
		for i := range n {
			fn(s, i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range w {
		wg.Go(func() {
			s := newScratch()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				fn(s, i)
			}
		})
	}
	wg.Wait()
}
