//go:build cgo

package libnccl

/*
#include "rlnccl.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cuda"
	"github.com/rlpipe/rlpipe/nccl"
)

// NCCL's enum values (nccl.h).
const (
	ncclInt32    = 2
	ncclFloat16  = 6
	ncclFloat32  = 7
	ncclBfloat16 = 9

	ncclSum = 0
	ncclMax = 2
	ncclAvg = 4
)

// NewComms returns a communicator whose ranks are the backends bs, which must
// be CUDA backends (*cuda.Backend), one per GPU, all in this process (ncclCommInitAll over their devices, which
// must differ). Collectives are enqueued on the rank's stream: the
// backend's own, or the one chosen with On; like the backend's ops they
// return before the work completes, and anything that reads the result
// through the backend (Download, Sync) waits for it. Each rank holds two
// NCCL communicators, one for its backend's default stream and one for the
// other streams, so that each NCCL communicator runs on a single stream; the
// collectives issued on each must come in the same order on every rank.
// Close aborts every rank's communicators, so that no rank hangs on a peer
// that failed. Its signature fits stages.RunOptions.Comms.
func NewComms(backends []gpu.Backend) ([]nccl.Comm, error) {
	if len(backends) == 0 {
		return nil, errors.New("nccl: no backends")
	}
	if _, err := Load(); err != nil {
		return nil, err
	}
	n := len(backends)
	bs := make([]*cuda.Backend, n)
	devs := make([]C.int, n)
	owner := map[int]int{} // GPU -> rank
	for i, gb := range backends {
		b, ok := gb.(*cuda.Backend)
		if !ok {
			return nil, fmt.Errorf("nccl: rank %d: backend %s is not a CUDA backend", i, gb.Name())
		}
		bs[i] = b
		d := b.Device().Index
		if o, dup := owner[d]; dup {
			return nil, fmt.Errorf("nccl: ranks %d and %d are both on GPU %d; NCCL needs one GPU per rank", o, i, d)
		}
		owner[d] = i
		devs[i] = C.int(d)
	}
	// The host side of Barrier is a loopback rendezvous; closing it is part
	// of aborting the group.
	g := &cudaGroup{n: n, host: nccl.NewLoopback(n), ownsHost: true}
	for _, set := range []*[]uintptr{&g.main, &g.side} {
		cs := make([]C.uintptr_t, n)
		runtime.LockOSThread()
		r := C.rl_nccl_init_all_(&cs[0], C.int(n), &devs[0])
		runtime.UnlockOSThread()
		if err := ncclErr("ncclCommInitAll", r); err != nil {
			g.abort()
			return nil, err
		}
		*set = make([]uintptr, n)
		for i := range cs {
			(*set)[i] = uintptr(cs[i])
		}
	}
	out := make([]nccl.Comm, n)
	for i, b := range bs {
		out[i] = &cudaComm{g: g, rank: i, slot: i, b: b}
	}
	return out, nil
}

// NewGroups returns, for backends of one process, the communicators of
// consecutive groups of size ranks (0..size−1, size..2·size−1, ...), each
// its own NewComms: context parallelism's cp groups, whose sends and
// receives pass keys and values round the group. Its signature, with size
// bound, fits stages.RunOptions.CPComms.
func NewGroups(backends []gpu.Backend, size int) ([]nccl.Comm, error) {
	if size < 1 || len(backends)%size != 0 {
		return nil, fmt.Errorf("nccl: %d ranks do not split into groups of %d", len(backends), size)
	}
	out := make([]nccl.Comm, 0, len(backends))
	for g := 0; g < len(backends); g += size {
		cs, err := NewComms(backends[g : g+size])
		if err != nil {
			for k := 0; k < len(out); k += size {
				out[k].Close()
			}
			return nil, fmt.Errorf("group of ranks %d-%d: %w", g, g+size-1, err)
		}
		out = append(out, cs...)
	}
	return out, nil
}

// NewRank returns this process's rank of a communicator whose ranks are
// processes, one GPU each, maybe on several hosts: backend is the rank's
// CUDA backend and host a host-memory communicator over the same ranks (the
// TCP one), which carries NCCL's unique ids from rank 0
// (ncclGetUniqueId) to every rank (ncclCommInitRank) and the host side of
// Barrier. When host fails (a peer process died or aborted), the NCCL
// communicators are aborted too, so that no collective waits for ever on a
// rank that is gone. Closing the result does not close host.
func NewRank(ctx context.Context, backend gpu.Backend, host nccl.Comm) (nccl.Comm, error) {
	b, ok := backend.(*cuda.Backend)
	if !ok {
		return nil, fmt.Errorf("nccl: rank %d: backend %s is not a CUDA backend", host.Rank(), backend.Name())
	}
	if _, err := Load(); err != nil {
		return nil, err
	}
	n, rank := host.Size(), host.Rank()
	var ids []byte
	if rank == 0 {
		ids = make([]byte, 2*C.RL_NCCL_ID_BYTES)
		for i := range 2 {
			if err := ncclErr("ncclGetUniqueId", C.rl_nccl_get_unique_id_((*C.char)(unsafe.Pointer(&ids[i*C.RL_NCCL_ID_BYTES])))); err != nil {
				return nil, err
			}
		}
	}
	ids, err := nccl.BroadcastBytes(ctx, host, 0, ids)
	if err != nil {
		return nil, fmt.Errorf("nccl: rank %d: handing over the unique ids: %w", rank, err)
	}
	if len(ids) != 2*C.RL_NCCL_ID_BYTES {
		return nil, fmt.Errorf("nccl: rank %d: got %d bytes of unique ids from rank 0", rank, len(ids))
	}
	g := &cudaGroup{n: n, host: []nccl.Comm{host}, main: []uintptr{0}, side: []uintptr{0}}
	// ncclCommInitRank blocks until every rank has called it; it runs on
	// the rank's device thread, where the GPU's context is current.
	err = b.Enqueue(func(uintptr) error {
		for i, set := range [][]uintptr{g.main, g.side} {
			var c C.uintptr_t
			id := (*C.char)(unsafe.Pointer(&ids[i*C.RL_NCCL_ID_BYTES]))
			if err := ncclErr("ncclCommInitRank", C.rl_nccl_init_rank_(&c, C.int(n), id, C.int(rank))); err != nil {
				return err
			}
			set[0] = uintptr(c)
		}
		return nil
	})
	if err == nil {
		err = b.Sync()
	}
	if err != nil {
		g.abort()
		return nil, fmt.Errorf("nccl: rank %d of %d: %w", rank, n, err)
	}
	g.follow(host)
	return &cudaComm{g: g, rank: rank, slot: 0, b: b}, nil
}

// follow aborts g when host fails or is closed, if host says when (the
// TCP communicator does).
func (g *cudaGroup) follow(host nccl.Comm) {
	d, ok := host.(interface{ Done() <-chan struct{} })
	if !ok {
		return
	}
	g.closed = make(chan struct{})
	go func() {
		select {
		case <-d.Done():
			g.abort()
		case <-g.closed:
		}
	}()
}

// cudaGroup is the state the ranks of a CUDA communicator share.
type cudaGroup struct {
	n          int
	main, side []uintptr   // ncclComm_t per rank of this process
	host       []nccl.Comm // per rank of this process, for Barrier's host rendezvous
	ownsHost   bool        // abort closes host
	closed     chan struct{}
	mu         sync.Mutex
	aborted    bool
	children   []*cudaGroup // communicators split from this one, aborted with it
}

func (g *cudaGroup) isAborted() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.aborted
}

// abort aborts every communicator of the group once.
func (g *cudaGroup) abort() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.aborted {
		return
	}
	g.aborted = true
	for _, set := range [][]uintptr{g.main, g.side} {
		for _, c := range set {
			if c != 0 {
				C.rl_nccl_abort_(C.uintptr_t(c))
			}
		}
	}
	if g.ownsHost {
		g.host[0].Close() // aborts every loopback rank
	}
	if g.closed != nil {
		close(g.closed)
	}
	for _, c := range g.children {
		c.abort()
	}
}

// cudaComm is one rank's handle; on is the stream its collectives go to
// (nil: the backend's default stream).
type cudaComm struct {
	g    *cudaGroup
	rank int
	slot int // index of the rank in g's slices
	b    *cuda.Backend
	on   gpu.Stream
}

func (c *cudaComm) Rank() int { return c.rank }
func (c *cudaComm) Size() int { return c.g.n }

// On returns the rank's handle for collectives on stream s (s nil: the
// default stream).
func (c *cudaComm) On(s gpu.Stream) nccl.Comm {
	return &cudaComm{g: c.g, rank: c.rank, slot: c.slot, b: c.b, on: s}
}

// issue enqueues one NCCL call on the handle's stream with its
// communicator.
func (c *cudaComm) issue(ctx context.Context, name string, call func(comm, stream C.uintptr_t) C.int) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("nccl: %s: %w", name, err)
	}
	if c.g.isAborted() {
		return fmt.Errorf("nccl: %s: communicator aborted", name)
	}
	b, comm := c.b, c.g.main[c.slot]
	if c.on != nil {
		cb, ok := c.b.On(c.on).(*cuda.Backend)
		if !ok {
			return fmt.Errorf("nccl: %s: stream is not from the rank's CUDA backend", name)
		}
		b, comm = cb, c.g.side[c.slot]
	}
	return b.Enqueue(func(stream uintptr) error {
		return ncclErr(name, call(C.uintptr_t(comm), C.uintptr_t(stream)))
	})
}

func ncclType(dt gpu.DType) (C.int, error) {
	switch dt {
	case gpu.F32:
		return ncclFloat32, nil
	case gpu.BF16:
		return ncclBfloat16, nil
	case gpu.F16:
		return ncclFloat16, nil
	case gpu.I32:
		return ncclInt32, nil
	}
	return 0, fmt.Errorf("nccl: dtype %v is not supported", dt)
}

func ncclOp(op nccl.Op) (C.int, error) {
	switch op {
	case nccl.Sum:
		return ncclSum, nil
	case nccl.Avg:
		return ncclAvg, nil
	case nccl.Max:
		return ncclMax, nil
	}
	return 0, fmt.Errorf("nccl: unknown op %v", op)
}

// ptrs returns the device addresses of ts and their NCCL dtype, which must
// be common to all.
func (c *cudaComm) ptrs(name string, ts ...gpu.Tensor) ([]C.uintptr_t, C.int, error) {
	ps := make([]C.uintptr_t, len(ts))
	for i, t := range ts {
		if i > 0 && t.DType != ts[0].DType {
			return nil, 0, fmt.Errorf("nccl: %s: dtypes %v and %v differ", name, ts[0].DType, t.DType)
		}
		p, err := c.b.DevicePtr(t)
		if err != nil {
			return nil, 0, fmt.Errorf("nccl: %s: %w", name, err)
		}
		ps[i] = C.uintptr_t(p)
	}
	dt, err := ncclType(ts[0].DType)
	if err != nil {
		return nil, 0, fmt.Errorf("nccl: %s: %w", name, err)
	}
	return ps, dt, nil
}

func (c *cudaComm) AllGather(ctx context.Context, dst, src gpu.Tensor) error {
	if err := nccl.CheckAllGather(c.g.n, dst, src); err != nil {
		return fmt.Errorf("nccl: %w", err)
	}
	ps, dt, err := c.ptrs("all-gather", src, dst)
	if err != nil {
		return err
	}
	return c.issue(ctx, "ncclAllGather", func(comm, s C.uintptr_t) C.int {
		return C.rl_nccl_all_gather_(ps[0], ps[1], C.size_t(src.Numel()), dt, comm, s)
	})
}

func (c *cudaComm) ReduceScatter(ctx context.Context, dst, src gpu.Tensor, op nccl.Op) error {
	if err := nccl.CheckReduceScatter(c.g.n, dst, src); err != nil {
		return fmt.Errorf("nccl: %w", err)
	}
	o, err := ncclOp(op)
	if err != nil {
		return err
	}
	ps, dt, err := c.ptrs("reduce-scatter", src, dst)
	if err != nil {
		return err
	}
	return c.issue(ctx, "ncclReduceScatter", func(comm, s C.uintptr_t) C.int {
		return C.rl_nccl_reduce_scatter_(ps[0], ps[1], C.size_t(dst.Numel()), dt, o, comm, s)
	})
}

func (c *cudaComm) AllReduce(ctx context.Context, buf gpu.Tensor, op nccl.Op) error {
	o, err := ncclOp(op)
	if err != nil {
		return err
	}
	ps, dt, err := c.ptrs("all-reduce", buf)
	if err != nil {
		return err
	}
	return c.issue(ctx, "ncclAllReduce", func(comm, s C.uintptr_t) C.int {
		return C.rl_nccl_all_reduce_(ps[0], ps[0], C.size_t(buf.Numel()), dt, o, comm, s)
	})
}

func (c *cudaComm) Broadcast(ctx context.Context, buf gpu.Tensor, root int) error {
	if root < 0 || root >= c.g.n {
		return fmt.Errorf("nccl: broadcast: root %d outside [0,%d)", root, c.g.n)
	}
	ps, dt, err := c.ptrs("broadcast", buf)
	if err != nil {
		return err
	}
	return c.issue(ctx, "ncclBroadcast", func(comm, s C.uintptr_t) C.int {
		return C.rl_nccl_broadcast_(ps[0], ps[0], C.size_t(buf.Numel()), dt, C.int(root), comm, s)
	})
}

// Shift sends each of send to the next rank (rank+1 mod size) and
// receives the previous rank's into recv, as one group of NCCL sends and
// receives on the handle's stream: a step of context parallelism's ring
// attention (it makes the communicator a model.Ring).
func (c *cudaComm) Shift(ctx context.Context, send, recv []gpu.Tensor) error {
	if len(send) != len(recv) {
		return fmt.Errorf("nccl: shift: %d tensors sent, %d received", len(send), len(recv))
	}
	if len(send) == 0 {
		return nil
	}
	n := len(send)
	sp, rp := make([]C.uintptr_t, n), make([]C.uintptr_t, n)
	counts, dts := make([]C.size_t, n), make([]C.int, n)
	for i := range send {
		if send[i].DType != recv[i].DType || send[i].Numel() != recv[i].Numel() {
			return fmt.Errorf("nccl: shift: tensor %d: sent %v, received %v", i, send[i], recv[i])
		}
		ps, dt, err := c.ptrs("shift", send[i], recv[i])
		if err != nil {
			return err
		}
		sp[i], rp[i], counts[i], dts[i] = ps[0], ps[1], C.size_t(send[i].Numel()), dt
	}
	next, prev := (c.rank+1)%c.g.n, (c.rank+c.g.n-1)%c.g.n
	return c.issue(ctx, "ncclSend/ncclRecv", func(comm, s C.uintptr_t) C.int {
		return C.rl_nccl_shift_(&sp[0], &rp[0], &counts[0], &dts[0], C.int(n), C.int(next), C.int(prev), comm, s)
	})
}

// grouped makes AllGatherGroup and ReduceScatterGroup issue their
// collectives as one NCCL group. It is on unless RLPIPE_NCCL_GROUP=0
// (then the tensors go one call each): at dp 4 on four H200s it made the
// train step 1.7-2.4% faster and ref_logprob 4% (docs/performance.md).
var grouped = os.Getenv("RLPIPE_NCCL_GROUP") != "0"

// AllGatherGroup all-gathers each src[i] into dst[i], as AllGather does.
// With grouped the calls form one NCCL group on the handle's stream,
// which NCCL launches as one kernel where separate calls launch one each
// (FSDP's per-parameter gathers of a unit: a dozen a decoder layer).
func (c *cudaComm) AllGatherGroup(ctx context.Context, dst, src []gpu.Tensor) error {
	return c.allGatherGroup(ctx, dst, src, grouped)
}

// allGatherGroup is AllGatherGroup, as one NCCL group when group is set.
func (c *cudaComm) allGatherGroup(ctx context.Context, dst, src []gpu.Tensor, group bool) error {
	each := func(i int) error { return c.AllGather(ctx, dst[i], src[i]) }
	a, err := c.groupArgs("all-gather", dst, src, group, each, func(i int) (int, error) {
		return src[i].Numel(), nccl.CheckAllGather(c.g.n, dst[i], src[i])
	})
	if err != nil || a == nil {
		return err
	}
	return c.issue(ctx, "ncclAllGather (group)", func(comm, s C.uintptr_t) C.int {
		return C.rl_nccl_all_gather_group_(&a.send[0], &a.recv[0], &a.count[0], &a.dt[0], C.int(len(src)), comm, s)
	})
}

// ReduceScatterGroup reduce-scatters each src[i] into dst[i] with op, as
// ReduceScatter does; with grouped, as one NCCL group on the handle's
// stream (a unit's per-parameter grad reductions).
func (c *cudaComm) ReduceScatterGroup(ctx context.Context, dst, src []gpu.Tensor, op nccl.Op) error {
	return c.reduceScatterGroup(ctx, dst, src, op, grouped)
}

// reduceScatterGroup is ReduceScatterGroup, as one NCCL group when group
// is set.
func (c *cudaComm) reduceScatterGroup(ctx context.Context, dst, src []gpu.Tensor, op nccl.Op, group bool) error {
	o, err := ncclOp(op)
	if err != nil {
		return err
	}
	each := func(i int) error { return c.ReduceScatter(ctx, dst[i], src[i], op) }
	a, err := c.groupArgs("reduce-scatter", dst, src, group, each, func(i int) (int, error) {
		return dst[i].Numel(), nccl.CheckReduceScatter(c.g.n, dst[i], src[i])
	})
	if err != nil || a == nil {
		return err
	}
	return c.issue(ctx, "ncclReduceScatter (group)", func(comm, s C.uintptr_t) C.int {
		return C.rl_nccl_reduce_scatter_group_(&a.send[0], &a.recv[0], &a.count[0], &a.dt[0], o, C.int(len(src)), comm, s)
	})
}

// groupCall holds the C arguments of a group of collectives, one entry a
// tensor pair.
type groupCall struct {
	send, recv []C.uintptr_t
	count      []C.size_t
	dt         []C.int
}

// groupArgs checks a group of collectives named name, from src[i] into
// dst[i], and returns its C arguments (count(i) gives pair i's NCCL count
// and checks its shapes). Without group, or with no pair, it runs each(i)
// for every pair instead and returns nil.
func (c *cudaComm) groupArgs(name string, dst, src []gpu.Tensor, group bool, each func(int) error, count func(int) (int, error)) (*groupCall, error) {
	if len(dst) != len(src) {
		return nil, fmt.Errorf("nccl: %s group: %d destinations, %d sources", name, len(dst), len(src))
	}
	if !group || len(src) == 0 {
		for i := range src {
			if err := each(i); err != nil {
				return nil, fmt.Errorf("tensor %d: %w", i, err)
			}
		}
		return nil, nil
	}
	n := len(src)
	a := &groupCall{send: make([]C.uintptr_t, n), recv: make([]C.uintptr_t, n), count: make([]C.size_t, n), dt: make([]C.int, n)}
	for i := range src {
		k, err := count(i)
		if err != nil {
			return nil, fmt.Errorf("nccl: tensor %d: %w", i, err)
		}
		ps, dt, err := c.ptrs(name, src[i], dst[i])
		if err != nil {
			return nil, err
		}
		a.send[i], a.recv[i], a.count[i], a.dt[i] = ps[0], ps[1], C.size_t(k), dt
	}
	return a, nil
}

// Barrier waits for the rank's device work, then for every rank to arrive.
func (c *cudaComm) Barrier(ctx context.Context) error {
	if err := c.b.Sync(); err != nil {
		return err
	}
	return c.g.host[c.slot].Barrier(ctx)
}

// Close aborts the whole communicator (every rank's pending and later
// collectives fail).
func (c *cudaComm) Close() error {
	c.g.abort()
	return nil
}
