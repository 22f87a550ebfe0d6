package stages

import (
	"fmt"

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
// sharded grads.
func (d *decoder) gradShard(u *Unit, s model.Slot) (gpu.Tensor, error) {
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

// gradsSeen, when set (by tests), is called at each optimizer op of a
// device-resident update with the view of every slot's grads, before
// AdamW reads them.
var gradsSeen func(r *Rank, st *ShardState, view func(u *Unit, s model.Slot) (gpu.Tensor, error)) error
