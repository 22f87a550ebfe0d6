// Package lazy wraps a backend so that the work issued on its streams, other
// than the default one, runs as late as the stream semantics allow: only
// when something waits for it (an event the default stream or a synchronous
// read waits for, a stream or event sync, a device sync). Work on the
// default stream runs at once.
//
// On the CPU backend every op completes before it returns, so a missing
// wait between two streams goes unseen there, however wrong it is on a GPU.
// Wrapped in this package, the CPU backend runs a stream's work only once it
// is waited for: work that reads what another stream writes, without
// waiting for that stream, reads what was there before, and a test that
// compares the run with an unwrapped one sees the difference. Collectives
// do not go through the backend: a communicator queues them on a stream
// with Stream.Later, and they run in their turn, blocking until the other
// ranks' run theirs, while the rank's other work goes on.
package lazy

import (
	"errors"
	"fmt"
	"sync"

	"github.com/rlpipe/rlpipe/gpu"
)

// device is the state the views of one wrapped backend share. Every op,
// deferred or not, runs with mu held, so the inner backend sees one op at
// a time, in an order the streams allow; only a blocking op (Stream.Later)
// runs without it.
type device struct {
	mu    sync.Mutex
	idle  *sync.Cond // on mu: a stream finished an op (Stream.busy)
	inner gpu.Backend
	own   map[gpu.Memory]struct{} // memory allocated through the wrapper
	live  []*Stream               // streams not yet closed
}

// Backend is a view of the wrapped backend that issues on one stream: the
// default stream (s nil), where ops run at once, or a stream of its own,
// where they wait in its queue.
type Backend struct {
	d *device
	s *Stream
}

var _ gpu.Backend = (*Backend)(nil)

// New wraps inner.
func New(inner gpu.Backend) *Backend {
	d := &device{inner: inner, own: map[gpu.Memory]struct{}{}}
	d.idle = sync.NewCond(&d.mu)
	return &Backend{d: d}
}

// Stream is a queue of deferred work. done counts the ops that ran, issued
// the ops ever queued; the queue holds the rest, in order. busy is set
// while one of its ops runs: no other goroutine runs its queue meanwhile.
type Stream struct {
	d      *device
	queue  []queued
	done   int
	issued int
	err    error // the first error of a deferred op
	closed bool
	busy   bool
}

// queued is an op waiting in a stream's queue. A blocking op (Later) runs
// without the device's lock.
type queued struct {
	f        func() error
	blocking bool
}

// event marks the first at ops of stream s (s nil: the default stream,
// whose work has run when it is issued).
type event struct {
	d  *device
	s  *Stream
	at int
}

// run runs s's queued ops until done reaches at (mu held). A deferred
// op's error stays with the stream and is returned by this and every later
// run of it.
//
// While one goroutine runs an op of s, another that needs more of s waits
// for it; an op that waits for an event of s it has already passed returns
// at once. A blocking op runs with mu released, so that the rank's other
// goroutines go on issuing and running work meanwhile, as a GPU's other
// streams do while one waits in a collective.
func (s *Stream) run(at int) error {
	for s.done < at {
		if s.busy {
			s.d.idle.Wait()
			continue
		}
		if len(s.queue) == 0 {
			break
		}
		q := s.queue[0]
		s.queue = s.queue[1:]
		s.busy = true
		var err error
		if q.blocking {
			s.d.mu.Unlock()
			err = q.f()
			s.d.mu.Lock()
		} else {
			err = q.f()
		}
		s.busy = false
		s.done++
		s.d.idle.Broadcast()
		if err != nil && s.err == nil {
			s.err = err
		}
	}
	return s.err
}

// Later queues f on s as one op that may block until other goroutines act
// (a collective waiting for the other ranks): s runs it, in its turn,
// without holding the backend's lock.
func (s *Stream) Later(f func() error) error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return s.push(queued{f: f, blocking: true})
}

// push queues q (mu held).
func (s *Stream) push(q queued) error {
	if s.closed {
		return errors.New("lazy: op on a closed stream")
	}
	if s.err != nil {
		return s.err // a queued op failed, or the stream is not this backend's (On)
	}
	s.queue = append(s.queue, q)
	s.issued++
	return nil
}

// Sync runs every op queued on the stream.
func (s *Stream) Sync() error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return s.run(s.issued)
}

// Record returns an event for the ops queued so far.
func (s *Stream) Record() (gpu.Event, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if s.closed {
		return nil, errors.New("lazy: record on a closed stream")
	}
	return &event{d: s.d, s: s, at: s.issued}, nil
}

// Wait queues a wait for e: when the stream gets to it, e's ops run.
func (s *Stream) Wait(e gpu.Event) error {
	ev, ok := e.(*event)
	if !ok || ev.d != s.d {
		return fmt.Errorf("lazy: wait for an event %T of another backend", e)
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return s.push(queued{f: ev.run})
}

// Close runs the stream's queued ops and closes it.
func (s *Stream) Close() error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	err := s.run(s.issued)
	s.closed = true
	for i, x := range s.d.live {
		if x == s {
			s.d.live = append(s.d.live[:i], s.d.live[i+1:]...)
			break
		}
	}
	return err
}

// run runs the event's ops (mu held).
func (e *event) run() error {
	if e.s == nil {
		return nil
	}
	return e.s.run(e.at)
}

// Sync runs the event's ops.
func (e *event) Sync() error {
	e.d.mu.Lock()
	defer e.d.mu.Unlock()
	return e.run()
}

// Close releases the event.
func (e *event) Close() error { return nil }

// defaultStream is the stream of the view with no stream of its own.
type defaultStream struct{ d *device }

func (s defaultStream) Sync() error { return nil }

func (s defaultStream) Record() (gpu.Event, error) { return &event{d: s.d}, nil }

// Wait runs e's ops now: the default stream's work runs as it is issued.
func (s defaultStream) Wait(e gpu.Event) error {
	ev, ok := e.(*event)
	if !ok || ev.d != s.d {
		return fmt.Errorf("lazy: wait for an event %T of another backend", e)
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return ev.run()
}

func (s defaultStream) Close() error { return nil }

// Name returns the inner backend's name.
func (b *Backend) Name() string { return b.d.inner.Name() }

// Alloc allocates through the inner backend.
func (b *Backend) Alloc(bytes int64) (gpu.Memory, error) {
	return b.alloc(b.d.inner.Alloc, bytes)
}

// AllocHost allocates host memory through the inner backend.
func (b *Backend) AllocHost(bytes int64) (gpu.Memory, error) {
	return b.alloc(b.d.inner.AllocHost, bytes)
}

func (b *Backend) alloc(f func(int64) (gpu.Memory, error), bytes int64) (gpu.Memory, error) {
	b.d.mu.Lock()
	defer b.d.mu.Unlock()
	m, err := f(bytes)
	if err == nil {
		b.d.own[m] = struct{}{}
	}
	return m, err
}

// Free runs all queued work, then frees m.
func (b *Backend) Free(m gpu.Memory) error {
	b.d.mu.Lock()
	defer b.d.mu.Unlock()
	if err := b.d.runAll(); err != nil {
		return err
	}
	delete(b.d.own, m)
	return b.d.inner.Free(m)
}

// runAll runs every stream's queued ops (mu held).
func (d *device) runAll() error {
	var first error
	for _, s := range d.live {
		if err := s.run(s.issued); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// NewStream returns a stream whose work waits until something waits for it.
func (b *Backend) NewStream() (gpu.Stream, error) {
	b.d.mu.Lock()
	defer b.d.mu.Unlock()
	s := &Stream{d: b.d}
	b.d.live = append(b.d.live, s)
	return s, nil
}

// DefaultStream returns the stream whose work runs at once.
func (b *Backend) DefaultStream() gpu.Stream { return defaultStream{b.d} }

// On returns the view that issues on s: a stream of this backend, or its
// default stream; anything else yields a view whose ops fail.
func (b *Backend) On(s gpu.Stream) gpu.Backend {
	switch x := s.(type) {
	case *Stream:
		if x.d == b.d {
			return &Backend{d: b.d, s: x}
		}
	case defaultStream:
		if x.d == b.d {
			return &Backend{d: b.d}
		}
	}
	return &Backend{d: b.d, s: &Stream{d: b.d, err: fmt.Errorf("lazy: stream %T is not one of this backend's", s)}}
}

// Sync runs the work queued on every stream.
func (b *Backend) Sync() error {
	b.d.mu.Lock()
	defer b.d.mu.Unlock()
	if err := b.d.runAll(); err != nil {
		return err
	}
	return b.d.inner.Sync()
}

// do runs f on the inner backend now (the default stream), or queues it on
// the view's stream.
func (b *Backend) do(f func(gpu.Backend) error) error {
	b.d.mu.Lock()
	defer b.d.mu.Unlock()
	if b.s == nil {
		return f(b.d.inner)
	}
	return b.s.push(queued{f: func() error { return f(b.d.inner) }})
}

// now runs f on the inner backend once the view's stream has run all its
// queued work: a read the caller waits for.
func (b *Backend) now(f func(gpu.Backend) error) error {
	b.d.mu.Lock()
	defer b.d.mu.Unlock()
	if b.s != nil {
		if err := b.s.run(b.s.issued); err != nil {
			return err
		}
	}
	return f(b.d.inner)
}

// ownTensor reports whether t is absent or lives in memory allocated
// through the wrapper.
func (b *Backend) ownTensor(t gpu.Tensor) bool {
	if t.Mem == nil {
		return true
	}
	b.d.mu.Lock()
	defer b.d.mu.Unlock()
	_, ok := b.d.own[t.Mem]
	return ok
}

// memoryReleaser is what a backend that lets the trainer sleep offers
// (stages' releaser): the wrapper has it when its inner backend does.
type memoryReleaser interface {
	Release(m gpu.Memory) error
	Reacquire(m gpu.Memory) error
	ReleaseWorkspace() error
	ReacquireWorkspace() error
}

// withReleaser runs f on the inner backend's memoryReleaser at once, with
// the lock held and without running queued work first.
func (b *Backend) withReleaser(f func(memoryReleaser) error) error {
	r, ok := b.d.inner.(memoryReleaser)
	if !ok {
		return fmt.Errorf("lazy: the %s backend cannot release its memory", b.d.inner.Name())
	}
	b.d.mu.Lock()
	defer b.d.mu.Unlock()
	return f(r)
}

// Release releases m's storage through the inner backend at once, without
// running queued work first: queued work on m then fails, as it would
// read or write freed memory on a GPU.
func (b *Backend) Release(m gpu.Memory) error {
	return b.withReleaser(func(r memoryReleaser) error { return r.Release(m) })
}

// Reacquire gives m storage again through the inner backend.
func (b *Backend) Reacquire(m gpu.Memory) error {
	return b.withReleaser(func(r memoryReleaser) error { return r.Reacquire(m) })
}

// ReleaseWorkspace releases the inner backend's workspace.
func (b *Backend) ReleaseWorkspace() error {
	return b.withReleaser(memoryReleaser.ReleaseWorkspace)
}

// ReacquireWorkspace reacquires the inner backend's workspace.
func (b *Backend) ReacquireWorkspace() error {
	return b.withReleaser(memoryReleaser.ReacquireWorkspace)
}
