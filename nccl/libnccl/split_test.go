//go:build cgo

package libnccl

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cuda"
	"github.com/rlpipe/rlpipe/nccl"
)

// splitPaths are Split's two ways to a group's communicators: ncclCommSplit
// (NCCL 2.18 or later) and, where it is missing, a bootstrap over the
// group's host communicator.
var splitPaths = []struct {
	name    string
	noSplit bool
}{
	{"ncclCommSplit", false},
	{"bootstrap over the group's host", true},
}

// groupRank is one rank's part in a split test: its backend, world
// communicators (host and NCCL) and group communicators (host and NCCL).
type groupRank struct {
	b                 *cuda.Backend
	ctl, world, gHost nccl.Comm
	group             nccl.Comm
}

// splitRanks starts n ranks in this process as a job of a process per
// rank does (a TCP control communicator, NewRank over it), and splits them
// into groups of size consecutive ranks (nccl.Split of the control
// communicator, then Split).
func splitRanks(t *testing.T, bs []*cuda.Backend, size int) []*groupRank {
	t.Helper()
	n := len(bs)
	ctls := joinAll(t, n)
	rs := make([]*groupRank, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			g := &groupRank{b: bs[r], ctl: ctls[r]}
			rs[r] = g
			ctx := context.Background()
			var err error
			if g.world, err = NewRank(ctx, bs[r], ctls[r]); err != nil {
				errs[r] = err
				return
			}
			if g.gHost, err = nccl.Split(ctx, ctls[r], nccl.SplitConfig{Color: r / size, Key: r % size, Timeout: 10 * time.Second}); err != nil {
				errs[r] = err
				return
			}
			g.group, errs[r] = Split(ctx, g.world, g.gHost, r/size)
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, g := range rs {
			for _, c := range []nccl.Comm{g.group, g.world} {
				if c != nil {
					c.Close()
				}
			}
		}
	})
	noErrs(t, errs)
	return rs
}

// groupStep runs an all-reduce, a ring shift and a barrier on rank r's
// group communicator and returns the all-reduced and received values.
func groupStep(g *groupRank, r, elems int) (sum, got []float32, err error) {
	b := g.b
	mem, err := b.Alloc(int64(3 * elems * 4))
	if err != nil {
		return nil, nil, err
	}
	defer b.Free(mem)
	var xs [3]gpu.Tensor
	for i := range xs {
		if xs[i], err = gpu.NewTensor(mem, int64(i*elems*4), gpu.F32, elems); err != nil {
			return nil, nil, err
		}
	}
	vals := make([]float32, elems)
	for i := range vals {
		vals[i] = float32(r*elems + i%256)
	}
	for _, x := range xs[:2] {
		if err := b.Upload(x, vals); err != nil {
			return nil, nil, err
		}
	}
	ctx := context.Background()
	if err := g.group.AllReduce(ctx, xs[0], nccl.Sum); err != nil {
		return nil, nil, err
	}
	shift, ok := g.group.(interface {
		Shift(context.Context, []gpu.Tensor, []gpu.Tensor) error
	})
	if !ok {
		return nil, nil, errors.New("the group communicator has no Shift")
	}
	if err := shift.Shift(ctx, xs[1:2], xs[2:3]); err != nil {
		return nil, nil, err
	}
	if err := g.group.Barrier(ctx); err != nil {
		return nil, nil, err
	}
	sum, got = make([]float32, elems), make([]float32, elems)
	if err := b.Download(sum, xs[0]); err != nil {
		return nil, nil, err
	}
	if err := b.Download(got, xs[2]); err != nil {
		return nil, nil, err
	}
	return sum, got, nil
}

// TestCUDASplitOneGPU splits a world of one rank into its group of one on
// both paths, runs the group's collectives (a ring of one shifts to
// itself), and checks that the group is aborted when the control
// communicator fails.
func TestCUDASplitOneGPU(t *testing.T) {
	for _, path := range splitPaths {
		t.Run(path.name, func(t *testing.T) {
			bs := cudaBackends(t, 1)
			lib, _ := Load()
			if !path.noSplit && !hasSplit() {
				t.Skipf("NCCL %s has no ncclCommSplit", lib.Version)
			}
			t.Logf("NCCL %s (%s)", lib.Version, lib.Path)
			noSplit = path.noSplit
			defer func() { noSplit = false }()
			g := splitRanks(t, bs, 1)[0]
			sum, got, err := groupStep(g, 0, 1000)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]float32, 1000)
			for i := range want {
				want[i] = float32(i % 256)
			}
			if !slices.Equal(sum, want) || !slices.Equal(got, want) {
				t.Fatalf("a group of one: all-reduce %v..., shift %v..., want %v...", sum[:4], got[:4], want[:4])
			}
			g.ctl.(interface{ Abort(error) }).Abort(errors.New("a peer died"))
			deadline := time.Now().Add(5 * time.Second)
			for !g.group.(*cudaComm).g.isAborted() {
				if time.Now().After(deadline) {
					t.Fatal("the group was not aborted with the control communicator")
				}
				time.Sleep(time.Millisecond)
			}
			if _, _, err := groupStep(g, 0, 1000); err == nil {
				t.Error("group collectives after the control communicator failed: no error")
			}
		})
	}
}

// TestCUDASplit splits the GPUs of this machine (2 or 4; ranks in one
// process, as processes of a job would be) into cp groups of 2 on both
// paths and checks each group's all-reduce and ring shift.
func TestCUDASplit(t *testing.T) {
	info, err := cuda.Versions()
	if err != nil {
		if errors.Is(err, cuda.ErrNoDriver) {
			t.Skipf("cuda: no driver, NCCL test skipped: %v", err)
		}
		t.Fatal(err)
	}
	n := min(len(info.Devices), 4) / 2 * 2
	for _, path := range splitPaths {
		t.Run(path.name, func(t *testing.T) {
			bs := cudaBackends(t, max(n, 2))
			if !path.noSplit && !hasSplit() {
				lib, _ := Load()
				t.Skipf("NCCL %s has no ncclCommSplit", lib.Version)
			}
			noSplit = path.noSplit
			defer func() { noSplit = false }()
			rs := splitRanks(t, bs, 2)
			const elems = 1000
			sums, gots := make([][]float32, n), make([][]float32, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for r := range n {
				wg.Go(func() { sums[r], gots[r], errs[r] = groupStep(rs[r], r, elems) })
			}
			wg.Wait()
			noErrs(t, errs)
			for r := range n {
				mate := r ^ 1 // the other rank of its group: ring predecessor and partner
				for i := range elems {
					mine, theirs := float32(r*elems+i%256), float32(mate*elems+i%256)
					if sums[r][i] != mine+theirs {
						t.Fatalf("rank %d all-reduce[%d] = %v, want %v", r, i, sums[r][i], mine+theirs)
					}
					if gots[r][i] != theirs {
						t.Fatalf("rank %d shift[%d] = %v, want %v from rank %d", r, i, gots[r][i], theirs, mate)
					}
				}
			}
			if rs[0].group.Size() != 2 || rs[1].group.Rank() != 1 {
				t.Errorf("rank 1 is rank %d of a group of %d", rs[1].group.Rank(), rs[0].group.Size())
			}
		})
	}
}
