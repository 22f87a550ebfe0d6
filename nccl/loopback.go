package nccl

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/rlpipe/rlpipe/gpu"
)

// NewLoopback returns the n ranks of an in-process communicator, for
// testing sharded code without GPUs: call each rank's collectives from its
// own goroutine. Tensors must be in host-addressable memory (gpu.HostMemory,
// e.g. the CPU backend's). Each collective is a rendezvous of all ranks;
// results are computed in Go-heap scratch of the collective's size. If a
// rank's context is cancelled or its Comm closed while others wait, the
// communicator is aborted: every rank's pending and later calls return an
// error. NewLoopback returns nil when n < 1.
func NewLoopback(n int) []Comm {
	if n < 1 {
		return nil
	}
	g := &group{n: n, release: make(chan struct{}), broken: make(chan struct{}), posts: make([]post, n)}
	cs := make([]Comm, n)
	for i := range cs {
		cs[i] = &loopComm{g: g, rank: i}
	}
	return cs
}

// post is what a rank brings to a collective.
type post struct {
	kind       string
	op         Op
	root       int
	dt         gpu.DType
	count      int // Elements of src (or buf).
	src, dst   []byte
	invalidArg error
}

// group is the shared state of a loopback communicator.
type group struct {
	n       int
	mu      sync.Mutex
	arrived int
	release chan struct{} // Closed when the current rendezvous completes.
	broken  chan struct{} // Closed when the communicator is aborted.
	err     error
	posts   []post
}

// rendezvous blocks until all ranks have arrived. A non-nil p is published
// in the rank's slot before arriving.
func (g *group) rendezvous(ctx context.Context, rank int, p *post) error {
	g.mu.Lock()
	if g.err != nil {
		g.mu.Unlock()
		return g.err
	}
	if err := ctx.Err(); err != nil {
		g.mu.Unlock()
		return g.abort(fmt.Errorf("loopback: rank %d: %w", rank, err))
	}
	if p != nil {
		g.posts[rank] = *p
	}
	ch := g.release
	g.arrived++
	if g.arrived == g.n {
		g.arrived = 0
		g.release = make(chan struct{})
		close(ch)
		g.mu.Unlock()
		return nil
	}
	g.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-g.broken:
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-ch: // The rendezvous completed first: it stands.
		return nil
	default:
	}
	if g.err == nil {
		g.setErr(fmt.Errorf("loopback: rank %d: %w", rank, ctx.Err()))
	}
	return g.err
}

// abort marks the communicator as failed with err and wakes all waiters.
func (g *group) abort(err error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		g.setErr(err)
	}
	return g.err
}

func (g *group) setErr(err error) {
	g.err = fmt.Errorf("communicator aborted: %w", err)
	close(g.broken)
}

type loopComm struct {
	g    *group
	rank int
}

func (c *loopComm) Rank() int { return c.rank }
func (c *loopComm) Size() int { return c.g.n }

// On returns c: loopback collectives complete before they return, so they
// are ordered with every stream.
func (c *loopComm) On(gpu.Stream) Comm { return c }

// Close aborts the communicator for all ranks.
func (c *loopComm) Close() error {
	c.g.abort(fmt.Errorf("loopback: rank %d closed", c.rank))
	return nil
}

// run performs one collective: publish p, wait for all ranks, compute this
// rank's result from everyone's posts (work returns a function that writes
// it), wait until every rank has finished reading, then write.
func (c *loopComm) run(ctx context.Context, p post, work func(posts []post) (func(), error)) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if err := c.g.rendezvous(ctx, c.rank, &p); err != nil {
		return err
	}
	posts := c.g.posts
	var apply func()
	err := check(posts)
	if err == nil {
		apply, err = work(posts)
	}
	if derr := c.g.rendezvous(ctx, c.rank, nil); derr != nil {
		return derr
	}
	if err != nil {
		return err
	}
	if apply != nil {
		apply()
	}
	return nil
}

// check verifies that all ranks called the same collective with compatible
// arguments. Every rank sees the same posts, so all agree on the error.
func check(posts []post) error {
	var errs []error
	for r, p := range posts {
		if p.invalidArg != nil {
			errs = append(errs, fmt.Errorf("rank %d: %w", r, p.invalidArg))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	p0 := posts[0]
	for r, p := range posts[1:] {
		switch {
		case p.kind != p0.kind:
			return fmt.Errorf("collective mismatch: rank 0 called %s, rank %d called %s", p0.kind, r+1, p.kind)
		case p.count != p0.count || p.dt != p0.dt:
			return fmt.Errorf("%s: rank 0 has %d %v elements, rank %d has %d %v", p.kind, p0.count, p0.dt, r+1, p.count, p.dt)
		case p.op != p0.op || p.root != p0.root:
			return fmt.Errorf("%s: ranks 0 and %d disagree on the operator or root", p.kind, r+1)
		}
	}
	return nil
}

func hostBytes(name string, t gpu.Tensor) ([]byte, error) {
	b, err := t.HostBytes()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return b, nil
}

func checkOp(op Op) error {
	if op != Sum && op != Avg && op != Max {
		return fmt.Errorf("unknown reduction %v", op)
	}
	return nil
}

// AllGather concatenates every rank's src into dst.
func (c *loopComm) AllGather(ctx context.Context, dst, src gpu.Tensor) error {
	p := post{kind: "allgather", dt: src.DType, count: src.Numel()}
	var err error
	if p.src, err = hostBytes("src", src); err == nil {
		if p.dst, err = hostBytes("dst", dst); err == nil {
			err = checkAllGather(c.g.n, dst, src)
		}
	}
	p.invalidArg = err
	return c.run(ctx, p, func(posts []post) (func(), error) {
		out := make([]byte, 0, len(p.dst))
		for _, q := range posts {
			out = append(out, q.src...)
		}
		return func() { copy(p.dst, out) }, nil
	})
}

// ReduceScatter reduces src over the ranks and keeps this rank's slice.
func (c *loopComm) ReduceScatter(ctx context.Context, dst, src gpu.Tensor, op Op) error {
	p := post{kind: "reducescatter", op: op, dt: src.DType, count: src.Numel()}
	err := checkOp(op)
	if err == nil {
		if p.src, err = hostBytes("src", src); err == nil {
			if p.dst, err = hostBytes("dst", dst); err == nil {
				err = checkReduceScatter(c.g.n, dst, src)
			}
		}
	}
	p.invalidArg = err
	return c.run(ctx, p, func(posts []post) (func(), error) {
		size := len(p.dst)
		lo := c.rank * size
		out, err := reduce(posts, lo, lo+size, p.dt, op)
		if err != nil {
			return nil, err
		}
		return func() { copy(p.dst, out) }, nil
	})
}

// AllReduce reduces buf over the ranks in place.
func (c *loopComm) AllReduce(ctx context.Context, buf gpu.Tensor, op Op) error {
	p := post{kind: "allreduce", op: op, dt: buf.DType, count: buf.Numel()}
	err := checkOp(op)
	if err == nil {
		p.src, err = hostBytes("buf", buf)
	}
	p.invalidArg = err
	return c.run(ctx, p, func(posts []post) (func(), error) {
		out, err := reduce(posts, 0, len(p.src), p.dt, op)
		if err != nil {
			return nil, err
		}
		return func() { copy(p.src, out) }, nil
	})
}

// Broadcast copies root's buf to every rank.
func (c *loopComm) Broadcast(ctx context.Context, buf gpu.Tensor, root int) error {
	p := post{kind: "broadcast", root: root, dt: buf.DType, count: buf.Numel()}
	var err error
	if root < 0 || root >= c.g.n {
		err = fmt.Errorf("broadcast: root %d outside [0,%d)", root, c.g.n)
	} else {
		p.src, err = hostBytes("buf", buf)
	}
	p.invalidArg = err
	return c.run(ctx, p, func(posts []post) (func(), error) {
		if c.rank == root {
			return nil, nil
		}
		out := append([]byte(nil), posts[root].src...)
		return func() { copy(p.src, out) }, nil
	})
}

// Barrier waits for all ranks.
func (c *loopComm) Barrier(ctx context.Context) error {
	return c.run(ctx, post{kind: "barrier"}, func([]post) (func(), error) { return nil, nil })
}

// reduce combines bytes [lo,hi) of every rank's src.
func reduce(posts []post, lo, hi int, dt gpu.DType, op Op) ([]byte, error) {
	es := dt.Size()
	n := (hi - lo) / es
	out := make([]byte, hi-lo)
	if dt == gpu.I32 {
		acc := make([]int64, n)
		for r, p := range posts {
			b := p.src[lo:hi]
			for i := range acc {
				v := int64(int32(uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24))
				switch {
				case r == 0:
					acc[i] = v
				case op == Max:
					acc[i] = max(acc[i], v)
				default:
					acc[i] += v
				}
			}
		}
		for i, v := range acc {
			if op == Avg {
				v /= int64(len(posts))
			}
			v = max(math.MinInt32, min(math.MaxInt32, v))
			u := uint32(int32(v))
			out[4*i], out[4*i+1], out[4*i+2], out[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
		}
		return out, nil
	}
	acc := make([]float32, n)
	tmp := make([]float32, n)
	for r, p := range posts {
		if err := gpu.DecodeF32(tmp, p.src[lo:hi], dt); err != nil {
			return nil, err
		}
		for i, v := range tmp {
			switch {
			case r == 0:
				acc[i] = v
			case op == Max:
				acc[i] = max(acc[i], v)
			default:
				acc[i] += v
			}
		}
	}
	if op == Avg {
		for i := range acc {
			acc[i] /= float32(len(posts))
		}
	}
	if err := gpu.EncodeF32(out, acc, dt); err != nil {
		return nil, err
	}
	return out, nil
}
