package lazy

import (
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
)

// fixture is a wrapped CPU backend with two streams and a one-element F32
// tensor x set to 1.
type fixture struct {
	b      *Backend
	s1, s2 gpu.Stream
	x      gpu.Tensor
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	b := New(cpu.New())
	m, err := b.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	x, err := gpu.NewTensor(m, 0, gpu.F32, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Fill(x, 1); err != nil {
		t.Fatal(err)
	}
	f := &fixture{b: b, x: x}
	if f.s1, err = b.NewStream(); err != nil {
		t.Fatal(err)
	}
	if f.s2, err = b.NewStream(); err != nil {
		t.Fatal(err)
	}
	return f
}

// value reads x on the default stream (which runs nothing queued).
func (f *fixture) value(t *testing.T) float32 {
	t.Helper()
	v := make([]float32, 1)
	if err := f.b.Download(v, f.x); err != nil {
		t.Fatal(err)
	}
	return v[0]
}

// chain has stream 2 wait for stream 1's work so far, then add x/2 to x.
func (f *fixture) chain(t *testing.T) {
	t.Helper()
	e, err := f.s1.Record()
	must(t, err)
	must(t, f.s2.Wait(e))
	must(t, f.b.On(f.s2).AddScaled(f.x, f.x, 0.5))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestOrder checks when queued work runs: x is scaled by 2 on stream 1,
// then each case waits (or not) in its own way and reads x.
func TestOrder(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait func(t *testing.T, f *fixture)
		want float32
	}{
		{"nothing waits", func(*testing.T, *fixture) {}, 1},
		{"stream sync", func(t *testing.T, f *fixture) { must(t, f.s1.Sync()) }, 2},
		{"device sync", func(t *testing.T, f *fixture) { must(t, f.b.Sync()) }, 2},
		{"event sync", func(t *testing.T, f *fixture) {
			e, err := f.s1.Record()
			must(t, err)
			must(t, e.Sync())
		}, 2},
		{"default stream waits", func(t *testing.T, f *fixture) {
			e, err := f.s1.Record()
			must(t, err)
			must(t, f.b.DefaultStream().Wait(e))
		}, 2},
		// Stream 2 waits for stream 1, then adds 1 to x: until something
		// waits for stream 2, neither runs; then both, in order.
		{"chained streams, not waited for", func(t *testing.T, f *fixture) { f.chain(t) }, 1},
		{"chained streams", func(t *testing.T, f *fixture) {
			f.chain(t)
			must(t, f.s2.Sync())
		}, 3},
		// A read on stream 2 runs stream 2's queue only.
		{"read on another stream", func(t *testing.T, f *fixture) {
			v := make([]float32, 1)
			must(t, f.b.On(f.s2).Download(v, f.x))
			if v[0] != 1 {
				t.Errorf("stream 2 read %v, want 1 (stream 1 not run)", v[0])
			}
		}, 1},
		{"read on the stream", func(t *testing.T, f *fixture) {
			v := make([]float32, 1)
			must(t, f.b.On(f.s1).Download(v, f.x))
		}, 2},
		{"record before the work", func(t *testing.T, f *fixture) {
			e, err := f.s1.Record()
			must(t, err)
			must(t, f.b.On(f.s1).Scale(f.x, 10))
			must(t, e.Sync())
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			must(t, f.b.On(f.s1).Scale(f.x, 2))
			tc.wait(t, f)
			if got := f.value(t); got != tc.want {
				t.Errorf("x = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDeferredError checks that a queued op's error comes back from the
// sync that runs it, from later syncs and from ops issued on the stream
// after it, and that a view of another backend's stream fails its ops.
func TestDeferredError(t *testing.T) {
	f := newFixture(t)
	y, err := gpu.NewTensor(f.x.Mem, 0, gpu.F32, 2, 1)
	must(t, err)
	if err := f.b.On(f.s1).Add(f.x, y, y); err != nil {
		t.Fatalf("queueing returned %v; the error belongs to the sync", err)
	}
	if err := f.s1.Sync(); err == nil {
		t.Error("sync of a stream with a failed op returned nil")
	}
	if err := f.b.Sync(); err == nil {
		t.Error("a later device sync returned nil")
	}
	if err := f.b.On(f.s1).Scale(f.x, 2); err == nil {
		t.Error("an op queued on the failed stream returned nil")
	}
	if err := f.b.On(cpu.New().DefaultStream()).Scale(f.x, 2); err == nil {
		t.Error("an op on another backend's stream returned nil")
	}
}

// TestForeignCopy checks that a copy from memory the wrapper did not
// allocate runs when issued, on any stream, and that uploads take their
// source when issued.
func TestForeignCopy(t *testing.T) {
	f := newFixture(t)
	host := cpu.New()
	m, err := host.AllocHost(64)
	must(t, err)
	src, err := gpu.NewTensor(m, 0, gpu.F32, 1)
	must(t, err)
	must(t, host.Fill(src, 5))
	must(t, f.b.On(f.s1).Copy(f.x, src))
	must(t, host.Fill(src, 6))
	if got := f.value(t); got != 5 {
		t.Errorf("after a copy from foreign memory x = %v, want 5", got)
	}
	buf := []float32{7}
	must(t, f.b.On(f.s2).Upload(f.x, buf))
	buf[0] = 8
	must(t, f.s2.Sync())
	if got := f.value(t); got != 7 {
		t.Errorf("after an upload x = %v, want 7 (the source when issued)", got)
	}
}

// TestReleaseWithQueuedWork checks that work still queued on memory the
// wrapper released fails when it runs, and that the memory takes work
// again once reacquired.
func TestReleaseWithQueuedWork(t *testing.T) {
	f := newFixture(t)
	must(t, f.b.On(f.s1).Scale(f.x, 2))
	must(t, f.b.Release(f.x.Mem))
	if err := f.s1.Sync(); err == nil {
		t.Error("work queued on released memory ran without an error")
	}
	must(t, f.b.Reacquire(f.x.Mem))
	must(t, f.b.Fill(f.x, 3))
	if got := f.value(t); got != 3 {
		t.Errorf("after reacquiring, x = %v, want 3", got)
	}
}

// TestLater checks a blocking op: it runs in its stream's turn without the
// backend's lock, so the default stream takes work while it blocks; the
// stream's later work and its sync wait for it.
func TestLater(t *testing.T) {
	f := newFixture(t)
	release, started := make(chan struct{}), make(chan struct{})
	must(t, f.s1.(*Stream).Later(func() error {
		close(started)
		<-release
		return nil
	}))
	must(t, f.b.On(f.s1).Scale(f.x, 2))
	synced := make(chan error, 1)
	go func() { synced <- f.s1.Sync() }()
	<-started
	must(t, f.b.Fill(f.x, 5))
	select {
	case err := <-synced:
		t.Fatalf("the stream's sync returned (%v) while its blocking op ran", err)
	default:
	}
	close(release)
	must(t, <-synced)
	if got := f.value(t); got != 10 {
		t.Errorf("x = %v, want 10 (filled while the op blocked, then scaled)", got)
	}
}
