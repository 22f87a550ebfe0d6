package stages

import (
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/model"
)

// ShardState is the persistent FSDP2 state of one model on one rank.
type ShardState struct {
	Model  *Model
	Fsdp   *ApplyFSDP2
	Units  []*Unit
	Params *ref // one section per unit, in the unit's master dtype
	// Grads is fp32, one section per unit, in host memory; only a trained
	// model whose optimizer state is offloaded has it (the train stage
	// holds device grads through an update, update_grads.go).
	Grads *ref
	AdamM *ref
	AdamV *ref
	// GradBytes is the size of Grads (where kept), AdamM and AdamV: a section per unit
	// at its GradOff.
	GradBytes int64
	// GatherOnce, AccumulateGrads and OverlapReduce are apply_fsdp2's
	// gather_once, accumulate_grads_on_device and overlap_reduce as they
	// run: as written, or as planning chose where auto.
	GatherOnce, AccumulateGrads, OverlapReduce bool
	// World is the number of ranks the model is sharded over: the mesh's
	// world size, or 1 for a replicated model (apply_fsdp2's replicate),
	// which every rank holds whole.
	World int
	// Snapshot is pinned host memory holding a copy of Params, AdamM and
	// AdamV (at offsets 0, SnapM and SnapV) for a checkpoint written in
	// the background (train.checkpoint_async); nil without.
	Snapshot     *ref
	SnapM, SnapV int64
	// HostBF16 is pinned host memory holding the bf16 rounding of the
	// fp32 master params of the units with BF16Off >= 0, for an offloaded
	// model whose optimizer step runs on the host: the gathers of a unit
	// computed in bf16 copy it to the device instead of the fp32 master,
	// half the bytes, and no cast. Every writer of the masters rewrites
	// it: the host AdamW as it updates a unit, and refreshBF16 after
	// apply_fsdp2 loads or copies them and after a checkpoint restores
	// them (no other stage writes a trained model's weights:
	// checkWeightWriters). Nil when no unit has one (host_bf16_copy).
	HostBF16 *ref
	// pending is the optimizer update running on the host in the
	// background (host_update.go); nil when none.
	pending *hostUpdate
}

// Unit is one FSDP unit of a model on one rank.
type Unit struct {
	model.Unit
	Name  string
	Slots []model.Slot // the gathered layout (model.Config.Layout)
	// Elems is the element count of the gathered unit: every parameter
	// padded to dp*ceil(rows/dp) rows so each rank's dim-0 slice
	// all-gathers in place (FSDP2's padded per-parameter sharding). The
	// head of a tied model includes the embedding.
	Elems int64
	// ShardElems is the element count of this rank's shard of the unit's
	// own parameters.
	ShardElems int64
	// SliceElems is Elems/dp: this rank's slice of the gathered unit,
	// including a tied embedding that another unit owns.
	SliceElems int64
	// SliceOff is, per slot, its element offset in the rank's slice.
	SliceOff []int64
	// Master is the dtype of the stored shard: F32 (the fp32 master) for
	// a trainable model, the unit's compute dtype for a frozen one.
	Master gpu.DType
	// Off and GradOff are the byte offsets of the unit's section in the
	// params and in the fp32 grads / AdamW buffers.
	Off, GradOff int64
	// BF16Off is the byte offset of the unit's section in HostBF16, or -1
	// when it has none.
	BF16Off int64
	// ord is the unit's index in the model's units.
	ord int
}

// sliceOf returns slot k's part of t, a buffer laid out as the rank's slice
// of u (SliceOff).
func (u *Unit) sliceOf(t gpu.Tensor, k int) (gpu.Tensor, error) {
	off := int(u.SliceOff[k])
	return t.Flat(off, off+int(u.Slots[k].ShardElems()))
}

// Units returns the FSDP units of m sharded over dp ranks.
func Units(m *Model, dp int) []*Unit {
	cfg := m.Config
	var out []*Unit
	for _, u := range cfg.Units() {
		nu := &Unit{Unit: u, Slots: cfg.Layout(u, dp), ord: len(out), BF16Off: -1}
		switch u.Kind {
		case model.UnitEmbed:
			nu.Name = "embed"
		case model.UnitHead:
			nu.Name = "head"
		default:
			nu.Name = fmt.Sprintf("layer%d", u.Index)
		}
		nu.Elems = model.LayoutElems(nu.Slots)
		nu.ShardElems = model.LayoutShardElems(nu.Slots)
		for _, s := range nu.Slots {
			nu.SliceOff = append(nu.SliceOff, nu.SliceElems)
			nu.SliceElems += s.ShardElems()
		}
		out = append(out, nu)
	}
	return out
}

// owner returns the unit whose shard holds slot s of unit u.
func (st *ShardState) owner(u *Unit, s model.Slot) *Unit {
	if s.Tied {
		return st.Units[0]
	}
	return u
}

// paramShard is the view of slot s's rows in its owner's params shard.
func (st *ShardState) paramShard(u *Unit, s model.Slot) (gpu.Tensor, error) {
	o := st.owner(u, s)
	return section(st.Params.t, o.Off+s.ShardOffset*int64(o.Master.Size()), o.Master, s.ShardElems())
}

// hostBF16 is the view of slot s's rows in its owner's section of
// HostBF16, which the owner must have (BF16Off >= 0).
func (st *ShardState) hostBF16(u *Unit, s model.Slot) (gpu.Tensor, error) {
	o := st.owner(u, s)
	if st.HostBF16 == nil || o.BF16Off < 0 {
		return gpu.Tensor{}, fmt.Errorf("unit %s has no bf16 copy in host memory", o.Name)
	}
	return section(st.HostBF16.t, o.BF16Off+2*s.ShardOffset, gpu.BF16, s.ShardElems())
}

// refreshBF16 rewrites the HostBF16 sections of every unit that has one
// from its master params, on the host backend h, after the masters were
// written some other way than by the host AdamW (loaded, copied,
// restored). The caller has finished every device write to the masters.
func (st *ShardState) refreshBF16(h gpu.Backend) error {
	if st.HostBF16 == nil {
		return nil
	}
	for _, u := range st.Units {
		if u.BF16Off < 0 {
			continue
		}
		src, err := section(st.Params.t, u.Off, u.Master, u.ShardElems)
		if err != nil {
			return err
		}
		dst, err := section(st.HostBF16.t, u.BF16Off, gpu.BF16, u.ShardElems)
		if err != nil {
			return err
		}
		if err := h.Copy(dst, src); err != nil {
			return fmt.Errorf("bf16 copy of %s: %w", u.Name, err)
		}
	}
	return nil
}

// fp32Shard is the view of slot s's rows in an fp32 per-unit buffer (grads, m, v).
func (st *ShardState) fp32Shard(buf *ref, u *Unit, s model.Slot) (gpu.Tensor, error) {
	o := st.owner(u, s)
	return section(buf.t, o.GradOff+s.ShardOffset*4, gpu.F32, s.ShardElems())
}

// section views elems elements of dt at byte offset off of t's memory.
func section(t gpu.Tensor, off int64, dt gpu.DType, elems int64) (gpu.Tensor, error) {
	return gpu.NewTensor(t.Mem, t.Off+off, dt, int(elems))
}

// dtypeOf maps a precision policy value to a dtype.
func dtypeOf(dt string) gpu.DType {
	if dt == "fp32" {
		return gpu.F32
	}
	return gpu.BF16
}
