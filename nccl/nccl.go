// Package nccl defines the collective communication interface that the
// sharded (FSDP2-style) training code uses, and its pure-Go
// implementations: an in-process loopback in which N ranks are goroutines of
// one process working on host memory (NewLoopback), and a TCP communicator
// whose ranks are processes, on one host or several (JoinTCP), which also
// forms the groups of a communicator's ranks, each a TCP communicator of
// its own (Split: context parallelism's cp groups). NCCL itself
// is bound below, in package nccl/libnccl (cgo); this package builds
// without cgo.
//
// Every rank of a communicator must make the same collectives in the same
// order with matching arguments. Element counts, not shapes, must match.
// The host-memory communicators' collectives are blocking calls; their
// reductions accumulate in float32 for floating-point tensors (also for
// BF16 and F16) and in int64 for I32, in rank order, so results are
// identical on every rank and between the two. NCCL collectives are
// enqueued on the rank's CUDA stream (see Comm.On) and reduce in NCCL's
// order.
package nccl

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
)

// Op is a reduction operator.
type Op int

// The reduction operators.
const (
	Sum Op = iota // Element-wise sum.
	Avg           // Element-wise sum divided by the number of ranks (integer division for I32).
	Max           // Element-wise maximum.
)

// String returns "sum", "avg" or "max".
func (o Op) String() string {
	switch o {
	case Sum:
		return "sum"
	case Avg:
		return "avg"
	case Max:
		return "max"
	}
	return fmt.Sprintf("op(%d)", int(o))
}

// Comm is one rank's handle on a communicator of Size ranks.
type Comm interface {
	// Rank returns this rank's index in [0, Size).
	Rank() int
	// Size returns the number of ranks.
	Size() int
	// AllGather sets dst to the concatenation, in rank order, of every
	// rank's src; dst.Numel() must be Size()*src.Numel() and the dtypes
	// equal. src may be this rank's slice of dst (in place).
	AllGather(ctx context.Context, dst, src gpu.Tensor) error
	// ReduceScatter reduces src over the ranks and sets dst to this rank's
	// slice of the result: src.Numel() must be Size()*dst.Numel() and the
	// dtypes equal. dst may be this rank's slice of src (in place).
	ReduceScatter(ctx context.Context, dst, src gpu.Tensor, op Op) error
	// AllReduce reduces buf over the ranks, in place.
	AllReduce(ctx context.Context, buf gpu.Tensor, op Op) error
	// Broadcast sets buf on every rank to buf of rank root.
	Broadcast(ctx context.Context, buf gpu.Tensor, root int) error
	// Barrier returns when every rank has called it.
	Barrier(ctx context.Context) error
	// On returns this rank's handle for collectives ordered on stream s of
	// the rank's backend (nil: the default stream). Communicators whose
	// collectives complete before returning (the loopback) return
	// themselves.
	On(s gpu.Stream) Comm
	// Close releases the rank's handle. Ranks still waiting in a
	// collective, and later calls, fail instead of hanging.
	Close() error
}

// CheckAllGather checks an all-gather over n ranks: dst holds n times src's
// elements, of src's dtype.
func CheckAllGather(n int, dst, src gpu.Tensor) error {
	switch {
	case dst.DType != src.DType:
		return fmt.Errorf("allgather: dst is %v, src is %v", dst.DType, src.DType)
	case dst.Numel() != n*src.Numel():
		return fmt.Errorf("allgather: dst has %d elements, want %d×%d", dst.Numel(), n, src.Numel())
	}
	return nil
}

// CheckReduceScatter checks a reduce-scatter over n ranks: src holds n
// times dst's elements, of dst's dtype.
func CheckReduceScatter(n int, dst, src gpu.Tensor) error {
	switch {
	case dst.DType != src.DType:
		return fmt.Errorf("reducescatter: dst is %v, src is %v", dst.DType, src.DType)
	case src.Numel() != n*dst.Numel():
		return fmt.Errorf("reducescatter: src has %d elements, want %d×%d", src.Numel(), n, dst.Numel())
	}
	return nil
}

// Bytes is host memory for host-memory communicators (the loopback and
// TCP ones): a tensor over it can travel through their collectives.
type Bytes []byte

// Size returns the length of b.
func (b Bytes) Size() int64 { return int64(len(b)) }

// HostBytes returns b.
func (b Bytes) HostBytes() []byte { return b }

// BroadcastBytes sends data of rank root to every rank of a host-memory
// communicator and returns it (on root, data itself). The other ranks'
// data is ignored.
func BroadcastBytes(ctx context.Context, c Comm, root int, data []byte) ([]byte, error) {
	n := make(Bytes, 4)
	if c.Rank() == root {
		binary.LittleEndian.PutUint32(n, uint32(len(data)))
	}
	if err := c.Broadcast(ctx, gpu.Tensor{Mem: n, DType: gpu.I32, Shape: []int{1}}, root); err != nil {
		return nil, err
	}
	size := int(binary.LittleEndian.Uint32(n))
	buf := make(Bytes, (size+3)/4*4)
	if c.Rank() == root {
		copy(buf, data)
	}
	if err := c.Broadcast(ctx, gpu.Tensor{Mem: buf, DType: gpu.I32, Shape: []int{len(buf) / 4}}, root); err != nil {
		return nil, err
	}
	return buf[:size], nil
}

// HostRing passes host tensors round a ring of ranks of a host-memory
// communicator (the loopback or TCP one): Shift sends each tensor to the
// next rank of the ring and receives the previous one's. Members lists the
// ring's ranks in ring order (nil: every rank, 0 to Size−1); several
// rings may share the communicator (context parallelism's cp groups within
// a dp × cp mesh), in which case every rank of the communicator shifts at
// once. It does so with an all-gather, every rank receiving every block
// and keeping its predecessor's, so it moves Size times the data of a ring
// of sends; it is the reference and the CPU path (model.Ring).
type HostRing struct {
	C       Comm
	Members []int
}

// prev returns the rank this rank receives from.
func (h HostRing) prev() (int, error) {
	me := h.C.Rank()
	if h.Members == nil {
		return (me + h.C.Size() - 1) % h.C.Size(), nil
	}
	for i, r := range h.Members {
		if r == me {
			return h.Members[(i+len(h.Members)-1)%len(h.Members)], nil
		}
	}
	return 0, fmt.Errorf("shift: rank %d is not in its ring %v", me, h.Members)
}

// Shift sends send[i] to the next rank of the ring and receives the
// previous rank's into recv[i].
func (h HostRing) Shift(ctx context.Context, send, recv []gpu.Tensor) error {
	if len(send) != len(recv) {
		return fmt.Errorf("shift: %d tensors sent, %d received", len(send), len(recv))
	}
	prev, err := h.prev()
	if err != nil {
		return err
	}
	n := h.C.Size()
	for i := range send {
		if send[i].DType != recv[i].DType || send[i].Numel() != recv[i].Numel() {
			return fmt.Errorf("shift: tensor %d: sent %v, received %v", i, send[i], recv[i])
		}
		all := make(Bytes, int64(n)*send[i].Bytes())
		dst := gpu.Tensor{Mem: all, DType: send[i].DType, Shape: []int{n * send[i].Numel()}}
		if err := h.C.AllGather(ctx, dst, send[i]); err != nil {
			return fmt.Errorf("shift: %w", err)
		}
		out, err := recv[i].HostBytes()
		if err != nil {
			return fmt.Errorf("shift: %w", err)
		}
		size := int(send[i].Bytes())
		copy(out, all[prev*size:(prev+1)*size])
	}
	return nil
}
