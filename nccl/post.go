package nccl

import (
	"errors"
	"fmt"
	"math"

	"github.com/rlpipe/rlpipe/gpu"
)

// The kinds of collective, as they travel between processes.
const (
	kindAllGather uint8 = iota + 1
	kindReduceScatter
	kindAllReduce
	kindBroadcast
	kindBarrier
)

var kindNames = map[uint8]string{kindAllGather: "allgather", kindReduceScatter: "reducescatter", kindAllReduce: "allreduce", kindBroadcast: "broadcast", kindBarrier: "barrier"}

// post is what a rank brings to a collective of a host-memory communicator
// (the loopback and TCP ones): its arguments, the bytes of its source and
// destination, and the argument error it found, if any. Every rank computes
// its result from all ranks' posts with result, so both communicators
// produce the same bits.
type post struct {
	kind       uint8
	op         Op
	root       int
	dt         gpu.DType
	count      int // Elements of src (or buf).
	src, dst   []byte
	invalidArg error
}

// dest is where the rank's result goes: dst, or the buffer of an in-place
// collective.
func (p post) dest() []byte {
	if p.kind == kindAllGather || p.kind == kindReduceScatter {
		return p.dst
	}
	return p.src
}

func allGatherPost(n int, dst, src gpu.Tensor) post {
	p := post{kind: kindAllGather, dt: src.DType, count: src.Numel()}
	var err error
	if p.src, err = hostBytes("src", src); err == nil {
		if p.dst, err = hostBytes("dst", dst); err == nil {
			err = CheckAllGather(n, dst, src)
		}
	}
	p.invalidArg = err
	return p
}

func reduceScatterPost(n int, dst, src gpu.Tensor, op Op) post {
	p := post{kind: kindReduceScatter, op: op, dt: src.DType, count: src.Numel()}
	err := checkOp(op)
	if err == nil {
		if p.src, err = hostBytes("src", src); err == nil {
			if p.dst, err = hostBytes("dst", dst); err == nil {
				err = CheckReduceScatter(n, dst, src)
			}
		}
	}
	p.invalidArg = err
	return p
}

func allReducePost(buf gpu.Tensor, op Op) post {
	p := post{kind: kindAllReduce, op: op, dt: buf.DType, count: buf.Numel()}
	err := checkOp(op)
	if err == nil {
		p.src, err = hostBytes("buf", buf)
	}
	p.invalidArg = err
	return p
}

func broadcastPost(n int, buf gpu.Tensor, root int) post {
	p := post{kind: kindBroadcast, root: root, dt: buf.DType, count: buf.Numel()}
	var err error
	if root < 0 || root >= n {
		err = fmt.Errorf("broadcast: root %d outside [0,%d)", root, n)
	} else {
		p.src, err = hostBytes("buf", buf)
	}
	p.invalidArg = err
	return p
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
			return fmt.Errorf("collective mismatch: rank 0 called %s, rank %d called %s", kindNames[p0.kind], r+1, kindNames[p.kind])
		case p.count != p0.count || p.dt != p0.dt:
			return fmt.Errorf("%s: rank 0 has %d %v elements, rank %d has %d %v", kindNames[p.kind], p0.count, p0.dt, r+1, p.count, p.dt)
		case p.op != p0.op || p.root != p0.root:
			return fmt.Errorf("%s: ranks 0 and %d disagree on the operator or root", kindNames[p.kind], r+1)
		}
	}
	return nil
}

// result computes what rank receives from a checked collective: the bytes
// to copy into its destination (nil: nothing).
func result(posts []post, rank int) ([]byte, error) {
	p := posts[rank]
	switch p.kind {
	case kindAllGather:
		out := make([]byte, 0, len(p.src)*len(posts))
		for _, q := range posts {
			out = append(out, q.src...)
		}
		return out, nil
	case kindReduceScatter:
		size := len(p.src) / len(posts)
		return reduce(posts, rank*size, (rank+1)*size, p.dt, p.op)
	case kindAllReduce:
		return reduce(posts, 0, len(p.src), p.dt, p.op)
	case kindBroadcast:
		if rank == p.root {
			return nil, nil
		}
		return append([]byte(nil), posts[p.root].src...), nil // the root may write its buffer once it returns
	}
	return nil, nil
}

// results computes every rank's result, each reduction once: slices of one
// reduction have the bits of reducing each slice, since reductions are
// element-wise.
func results(posts []post) ([][]byte, error) {
	n := len(posts)
	out := make([][]byte, n)
	p := posts[0]
	switch p.kind {
	case kindAllGather, kindAllReduce:
		one, err := result(posts, 0)
		if err != nil {
			return nil, err
		}
		for r := range out {
			out[r] = one
		}
	case kindBroadcast:
		for r := range out {
			if r != p.root {
				out[r] = posts[p.root].src
			}
		}
	case kindReduceScatter:
		full, err := reduce(posts, 0, len(p.src), p.dt, p.op)
		if err != nil {
			return nil, err
		}
		size := len(full) / n
		for r := range out {
			out[r] = full[r*size : (r+1)*size]
		}
	}
	return out, nil
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

// fold combines the accumulator with the next rank's value (Avg sums; the
// caller divides).
func fold[T int64 | float32](acc, v T, first bool, op Op) T {
	switch {
	case first:
		return v
	case op == Max:
		return max(acc, v)
	}
	return acc + v
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
				acc[i] = fold(acc[i], v, r == 0, op)
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
			acc[i] = fold(acc[i], v, r == 0, op)
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
