package nccl

import (
	"context"
	"fmt"
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
// rank's result from everyone's posts, wait until every rank has finished
// reading, then write it into the rank's destination.
func (c *loopComm) run(ctx context.Context, p post) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if err := c.g.rendezvous(ctx, c.rank, &p); err != nil {
		return err
	}
	posts := c.g.posts
	var out []byte
	err := check(posts)
	if err == nil {
		out, err = result(posts, c.rank)
	}
	if derr := c.g.rendezvous(ctx, c.rank, nil); derr != nil {
		return derr
	}
	if err != nil {
		return err
	}
	copy(p.dest(), out)
	return nil
}

// AllGather concatenates every rank's src into dst.
func (c *loopComm) AllGather(ctx context.Context, dst, src gpu.Tensor) error {
	return c.run(ctx, allGatherPost(c.g.n, dst, src))
}

// ReduceScatter reduces src over the ranks and keeps this rank's slice.
func (c *loopComm) ReduceScatter(ctx context.Context, dst, src gpu.Tensor, op Op) error {
	return c.run(ctx, reduceScatterPost(c.g.n, dst, src, op))
}

// AllReduce reduces buf over the ranks in place.
func (c *loopComm) AllReduce(ctx context.Context, buf gpu.Tensor, op Op) error {
	return c.run(ctx, allReducePost(buf, op))
}

// Broadcast copies root's buf to every rank.
func (c *loopComm) Broadcast(ctx context.Context, buf gpu.Tensor, root int) error {
	return c.run(ctx, broadcastPost(c.g.n, buf, root))
}

// Barrier waits for all ranks.
func (c *loopComm) Barrier(ctx context.Context) error {
	return c.run(ctx, post{kind: kindBarrier})
}
