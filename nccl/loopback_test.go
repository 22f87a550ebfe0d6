package nccl

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
)

// mem is host memory for tests.
type mem []byte

func (m mem) Size() int64       { return int64(len(m)) }
func (m mem) HostBytes() []byte { return m }

// tensor returns a fresh tensor holding vals in dtype dt. It is called
// from rank goroutines, so it must not use t.
func tensor(dt gpu.DType, vals []float32) gpu.Tensor {
	m := make(mem, len(vals)*dt.Size())
	x := gpu.Tensor{Mem: m, DType: dt, Shape: []int{len(vals)}}
	if err := gpu.EncodeF32(m, vals, dt); err != nil {
		return gpu.Tensor{}
	}
	return x
}

func values(t *testing.T, x gpu.Tensor) []float32 {
	t.Helper()
	b, err := x.HostBytes()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, x.Numel())
	if err := gpu.DecodeF32(out, b, x.DType); err != nil {
		t.Fatal(err)
	}
	return out
}

// each runs fn on every rank concurrently and returns the errors by rank.
func each(cs []Comm, fn func(c Comm) error) []error {
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() { errs[i] = fn(c) })
	}
	wg.Wait()
	return errs
}

func noErrs(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func equal(t *testing.T, name string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %v, want %v", name, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: %v, want %v", name, got, want)
		}
	}
}

// rankVals are the test inputs of rank r: n values r*100 + i + 0.5.
func rankVals(r, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r*100+i) + 0.5
	}
	return v
}

func TestCollectives(t *testing.T) {
	ctx := context.Background()
	for _, impl := range impls {
		for _, n := range []int{1, 2, 4} {
			for _, dt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.I32} {
				t.Run(fmt.Sprintf("%s %d ranks %v", impl.name, n, dt), func(t *testing.T) {
					cs := impl.new(t, n)
					const per = 3
					round := func(v float32) float32 {
						if dt == gpu.I32 {
							return float32(gpu.F32ToI32(v))
						}
						return gpu.Round(dt, v)
					}

					// AllGather.
					dsts := make([]gpu.Tensor, n)
					noErrs(t, each(cs, func(c Comm) error {
						dsts[c.Rank()] = tensor(dt, make([]float32, n*per))
						return c.AllGather(ctx, dsts[c.Rank()], tensor(dt, rankVals(c.Rank(), per)))
					}))
					var want []float32
					for r := range n {
						for _, v := range rankVals(r, per) {
							want = append(want, round(v))
						}
					}
					for r := range n {
						equal(t, "allgather", values(t, dsts[r]), want)
					}

					// ReduceScatter Sum and Avg, and AllReduce Sum, Avg, Max.
					for _, op := range []Op{Sum, Avg, Max} {
						full := make([]float32, n*per)
						for i := range full {
							var acc int64
							var accF float32
							for r := range n {
								x := round(rankVals(r, n*per)[i])
								switch {
								case r == 0 || op == Max:
									accF, acc = max(accF, x), max(acc, int64(x))
									if r == 0 {
										accF, acc = x, int64(x)
									}
								default:
									accF += x
									acc += int64(x)
								}
							}
							if op == Avg {
								accF /= float32(n)
								acc /= int64(n)
							}
							full[i] = round(accF)
							if dt == gpu.I32 {
								full[i] = float32(acc)
							}
						}
						rs := make([]gpu.Tensor, n)
						ar := make([]gpu.Tensor, n)
						noErrs(t, each(cs, func(c Comm) error {
							r := c.Rank()
							rs[r] = tensor(dt, make([]float32, per))
							if err := c.ReduceScatter(ctx, rs[r], tensor(dt, rankVals(r, n*per)), op); err != nil {
								return err
							}
							ar[r] = tensor(dt, rankVals(r, n*per))
							return c.AllReduce(ctx, ar[r], op)
						}))
						for r := range n {
							equal(t, "reducescatter "+op.String(), values(t, rs[r]), full[r*per:(r+1)*per])
							equal(t, "allreduce "+op.String(), values(t, ar[r]), full)
						}
					}

					// Broadcast from the last rank, then a barrier.
					bufs := make([]gpu.Tensor, n)
					noErrs(t, each(cs, func(c Comm) error {
						bufs[c.Rank()] = tensor(dt, rankVals(c.Rank(), per))
						if err := c.Broadcast(ctx, bufs[c.Rank()], n-1); err != nil {
							return err
						}
						return c.Barrier(ctx)
					}))
					for r := range n {
						equal(t, "broadcast", values(t, bufs[r]), values(t, tensor(dt, rankVals(n-1, per))))
					}
				})
			}
		}
	}
}

// TestInPlace gathers into a buffer whose slice is the source, and
// reduce-scatters into a slice of the source, as FSDP does.
func TestInPlace(t *testing.T) {
	for _, impl := range impls {
		t.Run(impl.name, func(t *testing.T) { testInPlace(t, impl.new) })
	}
}

func testInPlace(t *testing.T, newComms func(*testing.T, int) []Comm) {
	const n, per = 4, 2
	cs := newComms(t, n)
	ctx := context.Background()
	bufs := make([]gpu.Tensor, n)
	noErrs(t, each(cs, func(c Comm) error {
		r := c.Rank()
		full := make([]float32, n*per)
		copy(full[r*per:], rankVals(r, per))
		bufs[r] = tensor(gpu.F32, full)
		src, err := bufs[r].Flat(r*per, (r+1)*per)
		if err != nil {
			return err
		}
		if err := c.AllGather(ctx, bufs[r], src); err != nil {
			return err
		}
		// Every rank now holds the same vector; reduce-scatter it onto
		// the rank's own slice.
		return c.ReduceScatter(ctx, src, bufs[r], Sum)
	}))
	for r := range n {
		got := values(t, bufs[r])[r*per : (r+1)*per]
		want := rankVals(r, per)
		for i := range want {
			want[i] *= n
		}
		equal(t, "in place", got, want)
	}
}

// TestBF16ReducesInF32 checks that bf16 sums accumulate in float32: 256 +
// 1 + 1 is 258 in float32 but 256 when each partial sum is rounded to bf16.
func TestBF16ReducesInF32(t *testing.T) {
	for _, impl := range impls {
		cs := impl.new(t, 3)
		bufs := make([]gpu.Tensor, 3)
		noErrs(t, each(cs, func(c Comm) error {
			v := float32(1)
			if c.Rank() == 0 {
				v = 256
			}
			bufs[c.Rank()] = tensor(gpu.BF16, []float32{v})
			return c.AllReduce(context.Background(), bufs[c.Rank()], Sum)
		}))
		for r := range bufs {
			equal(t, impl.name+" bf16 sum", values(t, bufs[r]), []float32{258})
		}
	}
}

func TestArgumentErrors(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		fn   func(c Comm) error
	}{
		{"allgather size", func(c Comm) error {
			return c.AllGather(ctx, tensor(gpu.F32, make([]float32, 3)), tensor(gpu.F32, make([]float32, 2)))
		}},
		{"allgather dtype", func(c Comm) error {
			return c.AllGather(ctx, tensor(gpu.BF16, make([]float32, 4)), tensor(gpu.F32, make([]float32, 2)))
		}},
		{"reducescatter size", func(c Comm) error {
			return c.ReduceScatter(ctx, tensor(gpu.F32, make([]float32, 3)), tensor(gpu.F32, make([]float32, 4)), Sum)
		}},
		{"bad op", func(c Comm) error { return c.AllReduce(ctx, tensor(gpu.F32, make([]float32, 2)), Op(9)) }},
		{"bad root", func(c Comm) error { return c.Broadcast(ctx, tensor(gpu.F32, make([]float32, 2)), 2) }},
		{"count mismatch", func(c Comm) error {
			return c.AllReduce(ctx, tensor(gpu.F32, make([]float32, 2+c.Rank())), Sum)
		}},
		{"collective mismatch", func(c Comm) error {
			if c.Rank() == 0 {
				return c.Barrier(ctx)
			}
			return c.AllReduce(ctx, tensor(gpu.F32, make([]float32, 2)), Sum)
		}},
		{"only one rank bad", func(c Comm) error {
			n := 2
			if c.Rank() == 1 {
				n = 5
			}
			return c.AllGather(ctx, tensor(gpu.F32, make([]float32, n)), tensor(gpu.F32, make([]float32, 1)))
		}},
		{"not host memory", func(c Comm) error {
			return c.AllReduce(ctx, gpu.Tensor{Mem: devMem{}, DType: gpu.F32, Shape: []int{1}}, Sum)
		}},
	}
	for _, impl := range impls {
		for _, tc := range tests {
			t.Run(impl.name+" "+tc.name, func(t *testing.T) {
				cs := impl.new(t, 2)
				for r, err := range each(cs, tc.fn) {
					if err == nil {
						t.Errorf("rank %d: no error", r)
					}
				}
				// The communicator stays usable after argument errors.
				noErrs(t, each(cs, func(c Comm) error { return c.Barrier(ctx) }))
			})
		}
	}
	if NewLoopback(0) != nil {
		t.Error("NewLoopback(0) is not nil")
	}
}

type devMem struct{}

func (devMem) Size() int64 { return 4 }

// TestCancel checks that a rank whose context is cancelled makes the others
// fail instead of hanging, whether it cancels while waiting or never comes.
func TestCancel(t *testing.T) {
	tests := []struct {
		name string
		fn   func(c Comm, cancelled context.Context) error
	}{
		{"cancel while waiting", func(c Comm, cancelled context.Context) error {
			switch c.Rank() {
			case 2: // Waits in the barrier until its context is cancelled.
				return c.Barrier(cancelled)
			case 3: // Never joins.
				return nil
			}
			return c.Barrier(context.Background())
		}},
		{"cancelled before entry", func(c Comm, cancelled context.Context) error {
			ctx := context.Background()
			if c.Rank() == 0 {
				<-cancelled.Done()
				ctx = cancelled
			}
			return c.Barrier(ctx)
		}},
		{"closed", func(c Comm, cancelled context.Context) error {
			if c.Rank() == 1 {
				<-cancelled.Done()
				return c.Close()
			}
			return c.Barrier(context.Background())
		}},
	}
	for _, impl := range impls {
		for _, tc := range tests {
			t.Run(impl.name+" "+tc.name, func(t *testing.T) {
				cs := impl.new(t, 4)
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(20*time.Millisecond, cancel)
				done := make(chan []error)
				go func() { done <- each(cs, func(c Comm) error { return tc.fn(c, ctx) }) }()
				select {
				case errs := <-done:
					failed := 0
					for _, err := range errs {
						if err != nil {
							failed++
						}
					}
					if failed < 3 {
						t.Errorf("only %d ranks failed: %v", failed, errs)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("deadlock: collectives did not return after cancellation")
				}
				// The communicator stays aborted: later calls fail at once.
				bctx, bcancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer bcancel()
				for r, err := range each(cs, func(c Comm) error { return c.Barrier(bctx) }) {
					if err == nil || errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("rank %d: barrier after abort: %v", r, err)
					}
				}
			})
		}
	}
}

// TestConcurrentCommunicators runs independent communicators at once.
func TestConcurrentCommunicators(t *testing.T) {
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			cs := NewLoopback(4)
			for range 50 {
				errs := each(cs, func(c Comm) error {
					return c.AllReduce(context.Background(), tensor(gpu.F32, []float32{1, 2}), Sum)
				})
				for _, err := range errs {
					if err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}
