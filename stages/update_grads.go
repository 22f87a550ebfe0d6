package stages

import (
	"cmp"
	"fmt"
	"os"
	"slices"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/runtime/plan"
)

// A trained model whose optimizer state stays on the device keeps no grads
// between updates: each unit's fp32 sharded grads are a buffer of the
// train stage (<stage>.grads.<unit>), from the op that first reduces into
// it to the optimizer op. The backward reduces the units from the last
// layer back, so at the op where the stage peaks, the head's, with every
// layer's activations held, only the units the head writes (its own and a
// tied embedding's) have grads: the rest of the model's 4 bytes a
// parameter is free for activations, and recompute: auto recomputes fewer
// layers. When a rank may run several micro-batches in an update, every
// unit's grads live from the update's first op, since the later
// micro-batches' forwards run the same ops again. With the optimizer state
// offloaded, the grads stay a persistent buffer in host memory
// (ShardState.Grads), which the host's adds and AdamW read.

// beginUpdateGrads starts update up's grads at the current op, the
// update's first: with several micro-batches possible every unit's grads
// live from here. An update the plan laid out for one micro-batch that
// has more fails: the second forward would overwrite the first's grads.
func (d *decoder) beginUpdateGrads(up *update) {
	clear(d.raw)
	d.gradsFrom = -1
	if d.severalMicro {
		d.gradsFrom = d.p.now()
	}
	if d.p.running() && d.st.Grads == nil && !d.severalMicro && len(up.micro) > 1 {
		d.p.fail(fmt.Errorf("update %d has %d micro-batches on rank %d, but the plan laid its grads out for one (data.global_batch_size over the dp ranks at data.max_seq_len tokens each fits a micro-batch)", up.Index+1, len(up.micro), d.p.r.ID))
	}
}

// unitGrads declares (planning) or resolves (running) unit o's sharded
// grads for the update: the model's persistent grads' section when it has
// them, otherwise the stage's buffer of o's shard, which lives from the
// current op (or the update's first, see beginUpdateGrads) until the
// optimizer op extends it.
func (d *decoder) unitGrads(o *Unit) *ref {
	if d.st.Grads != nil {
		return nil
	}
	if d.grads[o.ord] == nil {
		r := d.p.buf(d.name("grads", o.Name), plan.Grads, gpu.F32, int(o.ShardElems))
		if r.pb != nil && d.gradsFrom >= 0 && d.gradsFrom < r.pb.Start {
			r.pb.Start = d.gradsFrom
		}
		d.grads[o.ord] = r
	}
	return d.grads[o.ord]
}

// declareGrads declares the grads of the units that own unit u's slots
// (a tied slot's owner is another unit), before the op that reduces u
// writes them.
func (d *decoder) declareGrads(u *Unit) {
	for _, s := range u.Slots {
		d.unitGrads(d.st.owner(u, s))
	}
}

// gradShard is the view of slot s's rows of unit u in its owner's fp32
// sharded grads, or, for a unit whose grads stay raw (rawGrads), in the
// buffer its backward accumulated them into (the compute dtype).
func (d *decoder) gradShard(u *Unit, s model.Slot) (gpu.Tensor, error) {
	if r := d.raw[u.ord]; r != nil {
		return section(r.t, s.Offset*int64(r.t.DType.Size()), r.t.DType, s.PaddedElems())
	}
	if d.st.Grads != nil {
		return d.st.fp32Shard(d.st.Grads, u, s)
	}
	return section(d.unitGrads(d.st.owner(u, s)).t, s.ShardOffset*4, gpu.F32, s.ShardElems())
}

// gradView is unit u's whole fp32 sharded grads (running only).
func (d *decoder) gradView(u *Unit) (gpu.Tensor, error) {
	if d.st.Grads != nil {
		return section(d.st.Grads.t, u.GradOff, gpu.F32, u.ShardElems)
	}
	return section(d.unitGrads(u).t, 0, gpu.F32, u.ShardElems)
}

// normView is what the grad norm sums for unit u: its raw grads' whole
// buffer (rawGrads; the gathered layout holds the same values) or its fp32
// sharded grads (running only).
func (d *decoder) normView(u *Unit) (gpu.Tensor, error) {
	if r := d.raw[u.ord]; r != nil {
		return r.t, nil
	}
	return d.gradView(u)
}

// gradsSeen, when set (by tests), is called at each optimizer op of a
// device-resident update with the view of every slot's grads, before
// AdamW reads them.
var gradsSeen func(r *Rank, st *ShardState, view func(u *Unit, s model.Slot) (gpu.Tensor, error)) error

// rawGradsOn is RLPIPE_RAW_GRADS=0's switch (on by default), to time the
// copy into fp32 sharded grads where rawGrads would leave them out.
var rawGradsOn = os.Getenv("RLPIPE_RAW_GRADS") != "0"

// rawGrads reports whether unit u's grads stay, for the update, in the
// buffer its backward accumulated them into (the compute dtype, the
// gathered layout) for the grad norm and AdamW to read there, instead of
// being copied into fp32 sharded grads first: on one rank (dp × cp = 1:
// no reduction, and the gathered rows are the shard's), with the
// optimizer state on the device, one micro-batch an update (nothing adds
// to them), and no tied slot in or into the unit. The values are the same
// (a 16-bit grad's float32 is exact); the grad norm's float64 sum takes
// them in the gathered order.
func (d *decoder) rawGrads(u *Unit) bool {
	if !rawGradsOn || d.st.Grads != nil || d.world > 1 || d.cp > 1 || d.severalMicro || d.st.Model.OffloadOptimizer {
		return false
	}
	for _, s := range u.Slots {
		if s.PaddedElems() != s.ShardElems() {
			return false
		}
	}
	for _, v := range d.st.Units {
		for _, s := range v.Slots {
			if o := d.st.owner(v, s); o != v && (v == u || o == u) {
				return false
			}
		}
	}
	return true
}

// rawRun is a run of a raw unit's slots adjacent in both the gathered
// buffer and the shard: elems elements at element offset gathered of the
// one and shard of the other.
type rawRun struct{ gathered, shard, elems int64 }

// rawRuns returns u's slots as runs in shard order, adjacent slots merged.
func rawRuns(u *Unit) []rawRun {
	ss := append([]model.Slot(nil), u.Slots...)
	slices.SortFunc(ss, func(a, b model.Slot) int { return cmp.Compare(a.ShardOffset, b.ShardOffset) })
	var out []rawRun
	for _, s := range ss {
		n := s.ShardElems()
		if k := len(out) - 1; k >= 0 && out[k].gathered+out[k].elems == s.Offset && out[k].shard+out[k].elems == s.ShardOffset {
			out[k].elems += n
			continue
		}
		out = append(out, rawRun{gathered: s.Offset, shard: s.ShardOffset, elems: n})
	}
	return out
}
