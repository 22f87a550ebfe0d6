package stages

import (
	"errors"

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

// loadOtherLayout fills s, a params tensor of a frozen model (n elements
// in the checkpoint file of this rank), from checkpoint directory dir
// written with the model in the other layout: a replica assembled from
// every rank's shard file, or this rank's shard cut from its replica file.
func (r *Rank) loadOtherLayout(dir string, s shardTensor, n int64) error {
	world := r.Comm.Size()
	if s.kind != "params" || s.st.Model.Trainable || world == 1 {
		return errLayout
	}
	whole := unitNamed(Units(s.st.Model, 1), s.u.Name)
	shard := unitNamed(Units(s.st.Model, world), s.u.Name)
	data := make([]float32, s.t.Numel())
	switch {
	case whole == nil || shard == nil:
		return errLayout
	case s.st.World == 1 && n == shard.ShardElems:
		for rank := range world {
			err := readRankRows(dir, rank, s.name, whole, shard, func(inShard, inWhole, k int64) (int64, []float32) {
				return inShard, data[inWhole : inWhole+k]
			})
			if err != nil {
				return err
			}
		}
	case s.st.World > 1 && n == whole.ShardElems:
		err := readRankRows(dir, r.ID, s.name, whole, shard, func(inShard, inWhole, k int64) (int64, []float32) {
			return inWhole, data[inShard : inShard+k]
		})
		if err != nil {
			return err
		}
	default:
		return errLayout
	}
	return r.B.Upload(s.t, data)
}

// readRankRows reads, for each untied parameter of unit shard, the rows
// rank holds (k elements, at inShard in the rank's shard and at inWhole in
// the unit laid out whole) from tensor of rank's file in checkpoint
// directory dir: at from, into dst, as at says.
func readRankRows(dir string, rank int, tensor string, whole, shard *Unit, at func(inShard, inWhole, k int64) (from int64, dst []float32)) error {
	ck, err := model.OpenCheckpoint(rankDir(dir, rank))
	if err != nil {
		return err
	}
	defer ck.Close()
	for _, sl := range shard.Slots {
		if sl.Tied {
			continue
		}
		i := slotIndex(whole, sl.Name)
		if i < 0 {
			return errLayout
		}
		r0 := int64(rank) * sl.ShardRows
		r1 := min(r0+sl.ShardRows, sl.Rows())
		if r1 <= r0 {
			continue // this rank holds only padding of it
		}
		from, dst := at(sl.ShardOffset, whole.Slots[i].ShardOffset+r0*sl.RowElems(), (r1-r0)*sl.RowElems())
		if err := ck.ReadRows(tensor, from, from+int64(len(dst)), dst); err != nil {
			return err
		}
	}
	return nil
}

// unitNamed is the unit of units called name, or nil.
func unitNamed(units []*Unit, name string) *Unit {
	for _, u := range units {
		if u.Name == name {
			return u
		}
	}
	return nil
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
