package stages

import (
	"errors"
	"fmt"

	"github.com/rlpipe/rlpipe/model"
)

// A frozen model's checkpoint tensors are laid out as the run held the
// model: a 1/world shard per rank, or whole on every rank where it was
// replicated (apply_fsdp2's replicate). The plan of a resumed run may
// choose otherwise (another GPU, or a run from before rlpipe replicated
// frozen models); its params are then read across the layouts, so the run
// resumes with the same values.

// errLayout is returned by loadOtherLayout for a tensor that fits neither
// layout.
var errLayout = errors.New("the tensor fits neither a shard nor a replica of its unit")

// loadOtherLayout fills s, a params tensor of frozen model st (n elements
// in the checkpoint file of this rank), from checkpoint directory dir
// written with st in the other layout: a replica assembled from every
// rank's shard file, or this rank's shard sliced from its replica file.
func (r *Rank) loadOtherLayout(dir string, st *ShardState, s shardTensor, n int64) error {
	world := r.Comm.Size()
	if st.Model.Trainable || world == 1 {
		return errLayout
	}
	var unit string
	for _, u := range st.Units {
		if s.name == fmt.Sprintf("%s.params.%s", st.Model.Name(), u.Name) {
			unit = u.Name
		}
	}
	if unit == "" {
		return errLayout
	}
	find := func(units []*Unit) *Unit {
		for _, u := range units {
			if u.Name == unit {
				return u
			}
		}
		return nil
	}
	whole, shard := find(Units(st.Model, 1)), find(Units(st.Model, world))
	switch {
	case whole == nil || shard == nil:
		return errLayout
	case st.World == 1 && n == shard.ShardElems:
		return r.assembleReplica(dir, s, whole, shard, world)
	case st.World > 1 && n == whole.ShardElems:
		return r.sliceReplica(dir, s, whole, shard)
	}
	return errLayout
}

// assembleReplica reads every rank's shard of unit shard (world ranks)
// from checkpoint directory dir into s, laid out as unit whole.
func (r *Rank) assembleReplica(dir string, s shardTensor, whole, shard *Unit, world int) error {
	data := make([]float32, s.t.Numel())
	for rank := range world {
		ck, err := model.OpenCheckpoint(rankDir(dir, rank))
		if err != nil {
			return err
		}
		for _, sl := range shard.Slots {
			if sl.Tied {
				continue
			}
			i := slotIndex(whole, sl.Name)
			if i < 0 {
				ck.Close()
				return errLayout
			}
			w := whole.Slots[i]
			r0 := int64(rank) * sl.ShardRows
			r1 := min(r0+sl.ShardRows, sl.Rows())
			if r1 <= r0 {
				continue
			}
			from := sl.ShardOffset
			dst := data[w.ShardOffset+r0*sl.RowElems() : w.ShardOffset+r1*sl.RowElems()]
			if err := ck.ReadRows(s.name, from, from+int64(len(dst)), dst); err != nil {
				ck.Close()
				return err
			}
		}
		ck.Close()
	}
	return r.B.Upload(s.t, data)
}

// sliceReplica reads this rank's rows of unit shard from its replica file
// (laid out as unit whole) in checkpoint directory dir into s; padding
// rows stay zero.
func (r *Rank) sliceReplica(dir string, s shardTensor, whole, shard *Unit) error {
	ck, err := model.OpenCheckpoint(rankDir(dir, r.ID))
	if err != nil {
		return err
	}
	defer ck.Close()
	data := make([]float32, s.t.Numel())
	for _, sl := range shard.Slots {
		if sl.Tied {
			continue
		}
		i := slotIndex(whole, sl.Name)
		if i < 0 {
			return errLayout
		}
		w := whole.Slots[i]
		r0 := int64(r.ID) * sl.ShardRows
		r1 := min(r0+sl.ShardRows, sl.Rows())
		if r1 <= r0 {
			continue
		}
		from := w.ShardOffset + r0*sl.RowElems()
		dst := data[sl.ShardOffset : sl.ShardOffset+(r1-r0)*sl.RowElems()]
		if err := ck.ReadRows(s.name, from, from+int64(len(dst)), dst); err != nil {
			return err
		}
	}
	return r.B.Upload(s.t, data)
}

// slotIndex is the index of unit u's untied slot called name.
func slotIndex(u *Unit, name string) int {
	for i, s := range u.Slots {
		if s.Name == name && !s.Tied {
			return i
		}
	}
	return -1
}
