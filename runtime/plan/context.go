package plan

import "strings"

// ContextUse is what context parallelism adds to a rank's plan: the rows
// of a micro-batch it holds, and the ring attention's buffers, which live
// only during a layer's attention op (the keys and values in hand and
// arriving, the block's partial output; in the backward also the
// travelling dk and dv sums). Every other activation of the rank is that
// of its rows, already in the activations column.
type ContextUse struct {
	CP   int `json:"cp"`
	Rows int `json:"rows"` // a rank's rows of a micro-batch, at most
	// RingForward and RingBackward are the largest ring attention scratch
	// of one layer's forward and backward attention op.
	RingForward  int64 `json:"ring_forward_bytes"`
	RingBackward int64 `json:"ring_backward_bytes"`
}

// RingScratch returns the bytes of the largest forward and backward ring
// attention scratch among the buffers: those named STAGE.TAG.UNIT.ring_X,
// grouped by STAGE.TAG.UNIT, tag "bwd" for the backward.
func RingScratch(bufs []*Buffer) (fwd, bwd int64) {
	groups := map[string]int64{}
	for _, b := range bufs {
		if i := strings.LastIndex(b.Name, ".ring_"); i > 0 {
			groups[b.Name[:i]] += b.Bytes
		}
	}
	for g, n := range groups {
		parts := strings.Split(g, ".")
		if len(parts) >= 2 && parts[len(parts)-2] == "bwd" {
			bwd = max(bwd, n)
		} else {
			fwd = max(fwd, n)
		}
	}
	return fwd, bwd
}
