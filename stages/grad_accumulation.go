package stages

import (
	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/runtime/plan"
)

// With apply_fsdp2's accumulate_grads_on_device, a model whose optimizer
// state is offloaded keeps a device copy of its fp32 grad shards, acc,
// through each update. In an update of several micro-batches every
// reduction sums the unit's grads into acc, as the reduction of a model
// that is not offloaded sums them into its grads: the first into a shard
// stores, later ones add. Only the last micro-batch's reductions then copy
// the unit's sums to host memory, on the Down stream, as an update of one
// micro-batch copies its grads. Without it each micro-batch's grads cross
// PCIe and the host's cores add the later ones in (hostAdder), whose memory
// traffic slows the copies both ways (docs/performance.md). The sums are
// those of the run on the device, bit for bit (TestGradAccumulation). An
// update of one micro-batch does not use acc.

// gradAccumulated, set only by tests, is called after each reduction
// that summed unit u's grads into acc, last in the update's last
// micro-batch.
var gradAccumulated func(u *Unit, last bool)

// planGradAccumulation declares acc, live from now to the op the caller
// extends it to, when the model accumulates its grads on the device; nil
// otherwise.
func (d *decoder) planGradAccumulation() *ref {
	d.acc = nil
	if !d.st.AccumulateGrads { // only for offload_optimizer: validation and auto see to it
		return nil
	}
	d.acc = d.p.buf(d.p.stage.ID+".grad_acc", plan.Grads, gpu.F32, int(d.st.GradBytes/4))
	return d.acc
}

// beginAccumulation sets whether the update's reductions sum into acc:
// with acc, in an update of several micro-batches (running).
func (d *decoder) beginAccumulation(micro int) {
	d.accOn = d.acc != nil && micro > 1
	d.accStored = map[int64]bool{}
}

// accumulate sums unit u's reduced grads srcs (per slot: the unsharded
// grads on one rank, the reduce-scattered shard on several) into their
// shards of acc on b. It reports, per slot, whether the slot's sum crosses
// to host memory now, and then sets srcs[k] to its shard of acc: only in
// the update's last micro-batch, and not for a tied slot, whose owner's
// reduction (the embedding's, the backward's last) copies the sum with its
// own.
func (d *decoder) accumulate(b gpu.Backend, u *Unit, srcs []gpu.Tensor) ([]bool, error) {
	send := make([]bool, len(u.Slots))
	for k, s := range u.Slots {
		a, err := d.st.fp32Shard(d.acc, u, s)
		if err != nil {
			return nil, err
		}
		if a.Numel() == 0 {
			continue // no rows of the slot on this rank
		}
		if !d.accStored[a.Off] {
			err = b.Copy(a, srcs[k])
			d.accStored[a.Off] = true
		} else {
			err = b.AddScaled(a, srcs[k], 1)
		}
		if err != nil {
			return nil, err
		}
		if d.accLast && !s.Tied {
			send[k], srcs[k] = true, a
		}
	}
	if gradAccumulated != nil {
		gradAccumulated(u, d.accLast)
	}
	return send, nil
}

// accSums queues the sum of squares of unit u's summed grads (its own
// shard of acc, final at its reduction in the last micro-batch) for the
// grad norm, when the device sums them (deviceNorms).
func (d *decoder) accSums(b gpu.Backend, u *Unit) error {
	if d.devNorms == nil || !d.accLast {
		return nil
	}
	t, err := section(d.acc.t, u.GradOff, gpu.F32, u.ShardElems)
	if err != nil {
		return err
	}
	return d.devNorms.sumShard(b, u, t)
}
