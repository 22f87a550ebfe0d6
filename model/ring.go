package model

import (
	"context"
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
)

// Context parallelism splits every sequence of a micro-batch over the cp
// ranks of a ring, in zigzag order, and computes attention as ring
// attention: only keys and values travel round the ring; queries, outputs
// and the rest of the layer stay where their rows are.
//
// Zigzag: a sequence padded to a multiple of 2·cp rows is cut into 2·cp
// chunks of c rows, and rank r holds chunks r and 2·cp−1−r, in that
// order. Every rank then has the same amount of causal work: an early
// chunk, which sees little, and a late one, which sees much.

// ZigzagLayout is a rank's rows of a micro-batch: for each sequence, its
// two chunks, one after the other.
type ZigzagLayout struct {
	Rank, Size int
	// Chunk holds each sequence's chunk length c (its padded length is
	// 2·Size·c); the rank holds 2c rows of it, from Start.
	Chunk []int
	Start []int // first local row of each sequence; Start[S] is the rank's rows
}

// NewZigzagLayout lays out sequences of the given lengths over size ranks
// for rank: each is padded to a multiple of 2·size.
func NewZigzagLayout(rank, size int, lengths []int) (ZigzagLayout, error) {
	if size < 1 || rank < 0 || rank >= size {
		return ZigzagLayout{}, fmt.Errorf("zigzag: rank %d of %d", rank, size)
	}
	z := ZigzagLayout{Rank: rank, Size: size, Start: []int{0}}
	for _, n := range lengths {
		if n < 0 {
			return ZigzagLayout{}, fmt.Errorf("zigzag: negative length %d", n)
		}
		c := (n + 2*size - 1) / (2 * size)
		z.Chunk = append(z.Chunk, c)
		z.Start = append(z.Start, z.Start[len(z.Start)-1]+2*c)
	}
	return z, nil
}

// Rows is the number of rows the rank holds.
func (z ZigzagLayout) Rows() int { return z.Start[len(z.Start)-1] }

// Global returns the position in its (padded) sequence of local row i, and
// the sequence.
func (z ZigzagLayout) Global(i int) (seq, pos int) {
	for s := range z.Chunk {
		if i < z.Start[s+1] {
			c, off := z.Chunk[s], i-z.Start[s]
			if off < c {
				return s, z.Rank*c + off
			}
			return s, (2*z.Size-1-z.Rank)*c + off - c
		}
	}
	return -1, -1
}

// CuSeqlens returns the cumulative local lengths of the sequences: the
// rank's own rows attend each other causally in this order, since its
// early chunk precedes its late one.
func (z ZigzagLayout) CuSeqlens() []int32 {
	out := make([]int32, len(z.Start))
	for i, s := range z.Start {
		out[i] = int32(s)
	}
	return out
}

// Spans returns what the rank's queries see of the keys and values that
// rank from holds (both in this layout's row order), for the backend's
// span attention: from an earlier rank, every local query sees its early
// chunk and nothing of its late one; from a later rank, only the local
// late chunk sees anything, and it sees both of that rank's chunks.
func (z ZigzagLayout) Spans(from int) []gpu.Span {
	out := make([]gpu.Span, len(z.Chunk))
	for s, c := range z.Chunk {
		st := z.Start[s]
		if from < z.Rank {
			out[s] = gpu.Span{Q: st, QLen: 2 * c, K: st, KLen: c}
		} else {
			out[s] = gpu.Span{Q: st + c, QLen: c, K: st, KLen: 2 * c}
		}
	}
	return out
}

// RingBackend is what ring attention needs of a backend: causal attention
// for the rank's own rows, span attention for the others' blocks, and the
// merge of blocks.
type RingBackend interface {
	gpu.Backend
	AttentionSpans(out, lse, q, k, v gpu.Tensor, spans []gpu.Span, scale float32) error
	AttentionSpansBackward(dq, dk, dv, dout, out, lse, q, k, v gpu.Tensor, spans []gpu.Span, scale float32) error
	MergeAttention(out, lse, bout, blse gpu.Tensor) error
}

// Ring passes blocks round the ring of cp ranks.
type Ring interface {
	// Shift sends each of send to the next rank and receives the previous
	// rank's into recv (matching tensors; send and recv must differ).
	Shift(ctx context.Context, send, recv []gpu.Tensor) error
}

// RingScratch holds the buffers ring attention needs besides its operands:
// two key/value blocks (one being used, one arriving), a block's partial
// output and log-sum-exp, and in the backward the travelling dk and dv and
// a block's contributions.
type RingScratch struct {
	K, V, K2, V2 gpu.Tensor // [Tl,Hkv,D]: the block used, and the next
	Out          gpu.Tensor // [Tl,Hq,D]
	LSE          gpu.Tensor // F32 [Hq,Tl]
	DQ           gpu.Tensor // [Tl,Hq,D] (backward)
	DK, DV       gpu.Tensor // [Tl,Hkv,D]: the travelling sums (backward)
	DK2, DV2     gpu.Tensor // [Tl,Hkv,D]: the arriving sums (backward)
	BK, BV       gpu.Tensor // [Tl,Hkv,D]: a block's contributions (backward)
}

// RingAttentionForward computes the attention of the rank's rows (layout
// z) over the whole sequences: out [Tl,Hq,D] and lse F32 [Hq,Tl], as
// Attention of the unsplit sequences would, for the rows this rank holds.
// cuSeqlens is the layout's CuSeqlens on the device. Step 0 is the rank's
// own causal block; at step s it holds the keys and values of rank r−s,
// received from rank r−1. (The shifts do not yet overlap the attention.)
func RingAttentionForward(ctx context.Context, b RingBackend, ring Ring, z ZigzagLayout, out, lse, q, k, v, cuSeqlens gpu.Tensor, sc *RingScratch, scale float32) error {
	if err := b.Attention(out, lse, q, k, v, cuSeqlens, scale); err != nil {
		return err
	}
	cur := []gpu.Tensor{k, v}
	bufs := [2][]gpu.Tensor{{sc.K, sc.V}, {sc.K2, sc.V2}}
	for step := 1; step < z.Size; step++ {
		next := bufs[(step-1)%2]
		if err := ring.Shift(ctx, cur, next); err != nil {
			return fmt.Errorf("ring attention step %d: %w", step, err)
		}
		from := (z.Rank - step + z.Size) % z.Size
		if err := b.AttentionSpans(sc.Out, sc.LSE, q, next[0], next[1], z.Spans(from), scale); err != nil {
			return err
		}
		if err := b.MergeAttention(out, lse, sc.Out, sc.LSE); err != nil {
			return err
		}
		cur = next
	}
	return nil
}

// RingAttentionBackward computes dq, dk and dv [Tl,...] of the rank's rows
// from dout and the out and lse RingAttentionForward returned. The keys and
// values go round the ring again, each block with the running sums of its
// dk and dv, to which every rank adds its part; a last shift brings every
// rank its own sums back.
func RingAttentionBackward(ctx context.Context, b RingBackend, ring Ring, z ZigzagLayout, dq, dk, dv, dout, out, lse, q, k, v, cuSeqlens gpu.Tensor, sc *RingScratch, scale float32) error {
	if err := b.AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, cuSeqlens, scale); err != nil {
		return err
	}
	if z.Size == 1 {
		return nil
	}
	if err := b.Zero(sc.DK); err != nil {
		return err
	}
	if err := b.Zero(sc.DV); err != nil {
		return err
	}
	// cur holds the block in hand and its travelling sums.
	cur := []gpu.Tensor{k, v, sc.DK, sc.DV}
	bufs := [2][]gpu.Tensor{{sc.K, sc.V, sc.DK2, sc.DV2}, {sc.K2, sc.V2, sc.DK, sc.DV}}
	for step := 1; step < z.Size; step++ {
		next := bufs[(step-1)%2]
		if err := ring.Shift(ctx, cur, next); err != nil {
			return fmt.Errorf("ring attention backward step %d: %w", step, err)
		}
		from := (z.Rank - step + z.Size) % z.Size
		if err := b.AttentionSpansBackward(sc.DQ, sc.BK, sc.BV, dout, out, lse, q, next[0], next[1], z.Spans(from), scale); err != nil {
			return err
		}
		for _, add := range [][2]gpu.Tensor{{dq, sc.DQ}, {next[2], sc.BK}, {next[3], sc.BV}} {
			if err := b.Add(add[0], add[0], add[1]); err != nil {
				return err
			}
		}
		cur = next
	}
	// The sums in hand belong to rank r+1: pass them on, and take ours.
	back := bufs[(z.Size-1)%2][2:]
	if err := ring.Shift(ctx, cur[2:], back); err != nil {
		return fmt.Errorf("ring attention backward: returning dk and dv: %w", err)
	}
	if err := b.Add(dk, dk, back[0]); err != nil {
		return err
	}
	return b.Add(dv, dv, back[1])
}
