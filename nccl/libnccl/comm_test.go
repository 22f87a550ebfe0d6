//go:build cgo

package libnccl

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cuda"
	"github.com/rlpipe/rlpipe/gpu/nvml"
	"github.com/rlpipe/rlpipe/nccl"
)

// cudaRanks returns two CUDA backends (GPUs 0 and 1) and their NCCL
// communicator, or skips saying why.
func cudaRanks(t *testing.T) ([]*cuda.Backend, []nccl.Comm) {
	t.Helper()
	bs := twoBackends(t)
	cs, err := NewComms([]gpu.Backend{bs[0], bs[1]})
	if err != nil {
		t.Fatal(err)
	}
	return bs, cs
}

// twoBackends returns CUDA backends on GPUs 0 and 1, closed when the test
// ends, or skips saying why (no driver, one GPU, no NCCL).
func twoBackends(t *testing.T) []*cuda.Backend { return cudaBackends(t, 2) }

// oneBackend returns a CUDA backend on GPU 0, or skips.
func oneBackend(t *testing.T) *cuda.Backend { return cudaBackends(t, 1)[0] }

// cudaBackends returns CUDA backends on GPUs 0 to n-1, closed when the test
// ends, or skips saying why (no driver, too few GPUs, no NCCL).
func cudaBackends(t testing.TB, n int) []*cuda.Backend {
	t.Helper()
	info, err := cuda.Versions()
	if err != nil {
		if errors.Is(err, cuda.ErrNoDriver) {
			t.Skipf("cuda: no driver, NCCL test skipped: %v", err)
		}
		t.Fatal(err)
	}
	if len(info.Devices) < n {
		t.Skipf("cuda: %d GPU(s), the NCCL test needs %d", len(info.Devices), n)
	}
	if _, err := Load(); err != nil {
		t.Skipf("nccl not available, test skipped: %v", err)
	}
	bs := make([]*cuda.Backend, n)
	for i := range bs {
		b, err := cuda.New(i)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		bs[i] = b
	}
	return bs
}

// TestCUDACollectives runs every collective on two GPUs and checks the
// results against values computed here; bf16 data movement is exact, sums
// of two float32 values are exact in either order.
func TestCUDACollectives(t *testing.T) {
	bs, cs := cudaRanks(t)
	const n = 1000 // elements per rank's slice
	val := func(rank, i int) float32 { return float32((rank+1)*1000+i%997) / 8 }
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	results := make([]map[string][]float32, 2)
	for r := range 2 {
		wg.Go(func() {
			res, err := runCollectives(ctx, bs[r], cs[r], r, n, val)
			results[r], errs[r] = res, err
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := range 2 {
		got := results[r]
		for i := range 2 * n {
			want := val(i/n, i%n)
			for _, k := range []string{"allgather f32", "allgather bf16", "allgather side stream", "allgather group f32", "allgather group bf16",
				"allgather group off f32", "allgather group off bf16"} {
				w := want
				if strings.HasSuffix(k, "bf16") {
					w = gpu.Round(gpu.BF16, want)
				}
				if got[k][i] != w {
					t.Fatalf("rank %d %s[%d] = %v, want %v", r, k, i, got[k][i], w)
				}
			}
		}
		for i := range n {
			j := r*n + i // this rank's slice of the reduced vector
			sum := val(0, j) + val(1, j)
			for _, k := range []string{"reducescatter sum", "reducescatter group 0", "reducescatter group 1", "reducescatter group off 0", "reducescatter group off 1"} {
				if got[k][i] != sum {
					t.Fatalf("rank %d %s[%d] = %v, want %v", r, k, i, got[k][i], sum)
				}
			}
			if d := math.Abs(float64(got["reducescatter avg"][i] - sum/2)); d > 1e-6*float64(sum) {
				t.Fatalf("rank %d reducescatter avg[%d] = %v, want %v", r, i, got["reducescatter avg"][i], sum/2)
			}
			if got["allreduce max"][i] != max(val(0, i), val(1, i)) {
				t.Fatalf("rank %d allreduce max[%d] = %v", r, i, got["allreduce max"][i])
			}
			if got["broadcast"][i] != val(1, i) {
				t.Fatalf("rank %d broadcast[%d] = %v, want rank 1's %v", r, i, got["broadcast"][i], val(1, i))
			}
		}
	}
}

// runCollectives is one rank's part of TestCUDACollectives.
func runCollectives(ctx context.Context, b *cuda.Backend, c nccl.Comm, rank, n int, val func(rank, i int) float32) (map[string][]float32, error) {
	mem, err := b.Alloc(1 << 20)
	if err != nil {
		return nil, err
	}
	defer b.Free(mem)
	var off int64
	ten := func(dt gpu.DType, elems int) gpu.Tensor {
		x, err := gpu.NewTensor(mem, off, dt, elems)
		if err != nil {
			panic(err)
		}
		off += (x.Bytes() + 255) / 256 * 256
		return x
	}
	mine := make([]float32, n)
	for i := range mine {
		mine[i] = val(rank, i)
	}
	full := make([]float32, 2*n) // this rank's input to the reductions
	for i := range full {
		full[i] = val(rank, i)
	}
	out := map[string][]float32{}
	get := func(k string, x gpu.Tensor) error {
		v := make([]float32, x.Numel())
		if err := b.Download(v, x); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		out[k] = v
		return nil
	}
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
		src, dst := ten(dt, n), ten(dt, 2*n)
		if err := b.Upload(src, mine); err != nil {
			return nil, err
		}
		if err := c.AllGather(ctx, dst, src); err != nil {
			return nil, err
		}
		if err := get("allgather "+map[gpu.DType]string{gpu.F32: "f32", gpu.BF16: "bf16"}[dt], dst); err != nil {
			return nil, err
		}
	}
	// The same as one NCCL group of both dtypes, and as AllGatherGroup
	// without the group (one call each), into fresh buffers.
	for _, grouped := range []bool{true, false} {
		k := map[bool]string{true: "allgather group", false: "allgather group off"}[grouped]
		srcs := []gpu.Tensor{ten(gpu.F32, n), ten(gpu.BF16, n)}
		dsts := []gpu.Tensor{ten(gpu.F32, 2*n), ten(gpu.BF16, 2*n)}
		for _, x := range srcs {
			if err := b.Upload(x, mine); err != nil {
				return nil, err
			}
		}
		if err := c.(*cudaComm).allGatherGroup(ctx, dsts, srcs, grouped); err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		if err := get(k+" f32", dsts[0]); err != nil {
			return nil, err
		}
		if err := get(k+" bf16", dsts[1]); err != nil {
			return nil, err
		}
	}
	// On a second stream, ordered after the upload by an event.
	s, err := b.NewStream()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	src, dst := ten(gpu.F32, n), ten(gpu.F32, 2*n)
	if err := b.Upload(src, mine); err != nil {
		return nil, err
	}
	ev, err := b.DefaultStream().Record()
	if err != nil {
		return nil, err
	}
	if err := s.Wait(ev); err != nil {
		return nil, err
	}
	ev.Close()
	if err := c.On(s).AllGather(ctx, dst, src); err != nil {
		return nil, err
	}
	if err := s.Sync(); err != nil {
		return nil, err
	}
	if err := get("allgather side stream", dst); err != nil {
		return nil, err
	}
	for _, op := range []nccl.Op{nccl.Sum, nccl.Avg} {
		in, o := ten(gpu.F32, 2*n), ten(gpu.F32, n)
		if err := b.Upload(in, full); err != nil {
			return nil, err
		}
		if err := c.ReduceScatter(ctx, o, in, op); err != nil {
			return nil, err
		}
		if err := get("reducescatter "+op.String(), o); err != nil {
			return nil, err
		}
	}
	// Both reductions as one NCCL group, and as ReduceScatterGroup without
	// the group.
	for _, group := range []bool{true, false} {
		k := map[bool]string{true: "reducescatter group", false: "reducescatter group off"}[group]
		ins := []gpu.Tensor{ten(gpu.F32, 2*n), ten(gpu.F32, 2*n)}
		outs := []gpu.Tensor{ten(gpu.F32, n), ten(gpu.F32, n)}
		for _, x := range ins {
			if err := b.Upload(x, full); err != nil {
				return nil, err
			}
		}
		if err := c.(*cudaComm).reduceScatterGroup(ctx, outs, ins, nccl.Sum, group); err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		for j, x := range outs {
			if err := get(fmt.Sprintf("%s %d", k, j), x); err != nil {
				return nil, err
			}
		}
	}
	buf := ten(gpu.F32, n)
	if err := b.Upload(buf, mine); err != nil {
		return nil, err
	}
	if err := c.AllReduce(ctx, buf, nccl.Max); err != nil {
		return nil, err
	}
	if err := get("allreduce max", buf); err != nil {
		return nil, err
	}
	bc := ten(gpu.F32, n)
	if err := b.Upload(bc, mine); err != nil {
		return nil, err
	}
	if err := c.Broadcast(ctx, bc, 1); err != nil {
		return nil, err
	}
	if err := get("broadcast", bc); err != nil {
		return nil, err
	}
	// Arguments are checked before anything reaches NCCL.
	if err := c.AllGather(ctx, ten(gpu.F32, 2*n), ten(gpu.F32, 3)); err == nil {
		return nil, errors.New("all-gather with mismatched sizes: no error")
	}
	if err := c.Barrier(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

// After Close, every rank's collectives fail instead of hanging.
func TestCUDACloseAborts(t *testing.T) {
	bs, cs := cudaRanks(t)
	if err := cs[0].Close(); err != nil {
		t.Fatal(err)
	}
	mem, err := bs[1].Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer bs[1].Free(mem)
	x, _ := gpu.NewTensor(mem, 0, gpu.F32, 16)
	if err := cs[1].AllReduce(context.Background(), x, nccl.Sum); err == nil {
		t.Error("all-reduce after the communicator was closed: no error")
	}
	if err := cs[1].Barrier(context.Background()); err == nil {
		t.Error("barrier after the communicator was closed: no error")
	}
}

// TestCUDAMemory measures, with NVML, what NCCL takes on GPU 0 beyond the
// backends' own memory once large and small collectives have run on both of
// a rank's streams (NCCL connects protocols lazily, on first use). The
// memory plan reserves stages.NCCLReserve (1536 MiB) for it.
func TestCUDAMemory(t *testing.T) {
	const reserve = 1536 << 20 // stages.NCCLReserve
	bs := twoBackends(t)
	mems := make([]gpu.Memory, 2)
	const per = 32 << 20 // elements per rank's slice
	for i, b := range bs {
		var err error
		if mems[i], err = b.Alloc(3 * 2 * per * 4); err != nil {
			t.Fatal(err)
		}
	}
	before, err := nvml.ProcessMemory(0)
	if err != nil {
		t.Skipf("nvml: no per-process figure: %v", err)
	}
	cs, err := NewComms([]gpu.Backend{bs[0], bs[1]})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range 2 {
		wg.Go(func() {
			b, c := bs[r], cs[r]
			s, err := b.NewStream()
			if err != nil {
				errs[r] = err
				return
			}
			defer s.Close()
			for _, n := range []int{256, 64 << 10, per} {
				full, _ := gpu.NewTensor(mems[r], 0, gpu.F32, 2*n)
				part, _ := gpu.NewTensor(mems[r], int64(2*per*4), gpu.F32, n)
				for _, cc := range []nccl.Comm{c, c.On(s)} {
					if err := cc.AllGather(ctx, full, part); err != nil {
						errs[r] = err
						return
					}
					if err := cc.ReduceScatter(ctx, part, full, nccl.Avg); err != nil {
						errs[r] = err
						return
					}
				}
			}
			if err := s.Sync(); err != nil {
				errs[r] = err
				return
			}
			errs[r] = c.Barrier(ctx)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	after, err := nvml.ProcessMemory(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NCCL on GPU 0, two communicators: %d MiB (reserve %d MiB)", (after-before)>>20, reserve>>20)
	if after-before > reserve {
		t.Errorf("NCCL takes %d MiB on GPU 0, above the plan's reserve of %d MiB", (after-before)>>20, reserve>>20)
	}
}

// TestCUDARankCollectives bootstraps NCCL per rank (ncclGetUniqueId on rank
// 0, the ids over a TCP host communicator, ncclCommInitRank on each rank's
// device thread), as the processes of a launched job do, here with the two
// ranks in one process, and runs every collective.
func TestCUDARankCollectives(t *testing.T) {
	bs := twoBackends(t)
	hosts := joinAll(t, 2)
	cs := make([]nccl.Comm, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() { cs[r], errs[r] = NewRank(context.Background(), bs[r], hosts[r]) })
	}
	wg.Wait()
	noErrs(t, errs)
	const n = 1000
	val := func(rank, i int) float32 { return float32((rank+1)*1000+i%997) / 8 }
	results := make([]map[string][]float32, 2)
	for r := range 2 {
		wg.Go(func() { results[r], errs[r] = runCollectives(context.Background(), bs[r], cs[r], r, n, val) })
	}
	wg.Wait()
	noErrs(t, errs)
	for r := range 2 {
		for i := range n {
			j := r*n + i
			if got, want := results[r]["reducescatter sum"][i], val(0, j)+val(1, j); got != want {
				t.Fatalf("rank %d reducescatter sum[%d] = %v, want %v", r, i, got, want)
			}
			if got := results[r]["broadcast"][i]; got != val(1, i) {
				t.Fatalf("rank %d broadcast[%d] = %v, want %v", r, i, got, val(1, i))
			}
		}
	}
}

// TestCUDARankHostAbort checks, on one GPU, the per-rank bootstrap and that
// a failed host communicator (a peer process died) aborts the NCCL one, so
// that its collectives fail instead of waiting for ever.
func TestCUDARankHostAbort(t *testing.T) {
	b := oneBackend(t)
	host, err := nccl.JoinTCP(context.Background(), nccl.TCPConfig{Rank: 0, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewRank(context.Background(), b, host)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := b.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free(mem)
	x, _ := gpu.NewTensor(mem, 0, gpu.F32, 16)
	want := make([]float32, 16)
	for i := range want {
		want[i] = float32(i) + 0.25
	}
	if err := b.Upload(x, want); err != nil {
		t.Fatal(err)
	}
	if err := c.AllReduce(context.Background(), x, nccl.Sum); err != nil {
		t.Fatal(err)
	}
	if err := c.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 16)
	if err := b.Download(got, x); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("all-reduce over one rank: %v, want %v", got, want)
	}
	host.(interface{ Abort(error) }).Abort(errors.New("a peer died"))
	deadline := time.Now().Add(5 * time.Second)
	for !c.(*cudaComm).g.isAborted() {
		if time.Now().After(deadline) {
			t.Fatal("the NCCL communicator was not aborted with its host communicator")
		}
		time.Sleep(time.Millisecond)
	}
	if err := c.AllReduce(context.Background(), x, nccl.Sum); err == nil {
		t.Error("all-reduce after the host communicator failed: no error")
	}
}

// joinAll joins n ranks of a TCP host communicator on localhost.
func joinAll(t *testing.T, n int) []nccl.Comm {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cs, errs := make([]nccl.Comm, n), make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			cs[r], errs[r] = nccl.JoinTCP(context.Background(), nccl.TCPConfig{Rank: r, Size: n, Addr: addr, Timeout: 10 * time.Second})
		})
	}
	wg.Wait()
	noErrs(t, errs)
	t.Cleanup(func() {
		for _, c := range cs {
			c.Close()
		}
	})
	return cs
}

// noErrs fails the test with every rank's error, if any.
func noErrs(t *testing.T, errs []error) {
	t.Helper()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestCUDAShift shifts two tensors (bf16 and f32) round a ring of every
// GPU the machine has (one GPU: a ring of one, which sends to itself) and
// checks that each rank received its predecessor's.
func TestCUDAShift(t *testing.T) {
	info, err := cuda.Versions()
	if err != nil {
		if errors.Is(err, cuda.ErrNoDriver) {
			t.Skipf("cuda: no driver, NCCL test skipped: %v", err)
		}
		t.Fatal(err)
	}
	n := max(1, min(len(info.Devices), 4))
	bs := cudaBackends(t, n)
	gbs := make([]gpu.Backend, n)
	for i, b := range bs {
		gbs[i] = b
	}
	cs, err := NewComms(gbs)
	if err != nil {
		t.Fatal(err)
	}
	defer cs[0].Close()
	const elems = 1000
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = func() error {
				b := bs[r]
				var send, recv []gpu.Tensor
				for _, dt := range []gpu.DType{gpu.BF16, gpu.F32} {
					for _, dst := range []*[]gpu.Tensor{&send, &recv} {
						mem, err := b.Alloc(int64(elems * dt.Size()))
						if err != nil {
							return err
						}
						defer b.Free(mem)
						x, err := gpu.NewTensor(mem, 0, dt, elems)
						if err != nil {
							return err
						}
						*dst = append(*dst, x)
					}
				}
				vals := make([]float32, elems)
				for i := range vals {
					vals[i] = float32(r*elems + i%256)
				}
				for _, x := range send {
					if err := b.Upload(x, vals); err != nil {
						return err
					}
				}
				for _, x := range recv {
					if err := b.Fill(x, -1); err != nil {
						return err
					}
				}
				if err := cs[r].(interface {
					Shift(context.Context, []gpu.Tensor, []gpu.Tensor) error
				}).Shift(context.Background(), send, recv); err != nil {
					return err
				}
				prev := (r + n - 1) % n
				got := make([]float32, elems)
				for k, x := range recv {
					if err := b.Download(got, x); err != nil {
						return err
					}
					for i, v := range got {
						if want := float32(prev*elems + i%256); v != want && !(k == 0 && math.Abs(float64(v-want)) <= math.Abs(float64(want))/128) {
							return fmt.Errorf("rank %d tensor %d element %d: %v, want %v from rank %d", r, k, i, v, want, prev)
						}
					}
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
