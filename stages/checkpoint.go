package stages

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/model"
)

// Checkpoints hold each rank's shards as they are in memory: for every model
// its params (in the stored dtype), and for a trained model its fp32 AdamW m
// and v, one tensor per FSDP unit, in <dir>/rank-<r>/model.safetensors.
// The optimizer step is the checkpoint's step (the run record keeps it).

// rankDir is the directory of rank r's shard file in a checkpoint.
func rankDir(dir string, r int) string { return filepath.Join(dir, fmt.Sprintf("rank-%d", r)) }

// shardTensor is one tensor of a checkpoint: its name, its view of the
// rank's state, its view of the model's snapshot (empty without
// train.checkpoint_async), and the model, unit and kind (params, adam_m,
// adam_v) it holds.
type shardTensor struct {
	name    string
	t, snap gpu.Tensor
	st      *ShardState
	u       *Unit
	kind    string
}

// shardTensors lists the rank's persistent state as named flat views.
func (r *Rank) shardTensors() []shardTensor {
	var out []shardTensor
	shards := r.shards()
	names := make([]string, 0, len(shards))
	for n := range shards {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		st := shards[n]
		for _, u := range st.Units {
			add := func(kind string, buf *ref, off, snapOff int64, dt gpu.DType) {
				if buf == nil {
					return
				}
				t, err := section(buf.t, off, dt, u.ShardElems)
				if err != nil {
					return
				}
				s := shardTensor{name: fmt.Sprintf("%s.%s.%s", n, kind, u.Name), t: t, st: st, u: u, kind: kind}
				if st.Snapshot != nil {
					if s.snap, err = section(st.Snapshot.t, snapOff, dt, u.ShardElems); err != nil {
						return
					}
				}
				out = append(out, s)
			}
			add("params", st.Params, u.Off, u.Off, u.Master)
			add("adam_m", st.AdamM, u.GradOff, st.SnapM+u.GradOff, gpu.F32)
			add("adam_v", st.AdamV, u.GradOff, st.SnapV+u.GradOff, gpu.F32)
		}
	}
	return out
}

// checkpointSpecs are the safetensors specs of a checkpoint's tensors.
func checkpointSpecs(list []shardTensor) []model.TensorSpec {
	specs := make([]model.TensorSpec, len(list))
	for i, s := range list {
		dt := model.F32
		if s.t.DType == gpu.BF16 {
			dt = model.BF16
		}
		specs[i] = model.TensorSpec{Name: s.name, DType: dt, Shape: []int64{int64(s.t.Numel())}}
	}
	return specs
}

// SaveShards writes the rank's shards into checkpoint directory dir,
// streamed: one shard tensor at a time goes through host memory.
func (r *Rank) SaveShards(dir string) error {
	if err := r.settle(); err != nil {
		return err
	}
	list := r.shardTensors()
	largest := 0
	for _, s := range list {
		largest = max(largest, s.t.Numel())
	}
	w, err := newShardWriter(dir, r.ID, checkpointSpecs(list))
	if err != nil {
		return err
	}
	buf := r.scratch(largest)
	for _, s := range list {
		data := buf[:s.t.Numel()]
		if err := r.download(data, s.t); err != nil {
			w.Abort()
			return fmt.Errorf("saving %s: %w", s.name, err)
		}
		if err := w.Write(s.name, data); err != nil {
			w.Abort()
			return err
		}
	}
	return w.Close()
}

// newShardWriter starts rank's shard file of checkpoint directory dir.
func newShardWriter(dir string, rank int, specs []model.TensorSpec) (*model.SafetensorsWriter, error) {
	path := filepath.Join(rankDir(dir, rank), model.SingleFileName)
	if err := mkdirAll(filepath.Dir(path)); err != nil {
		return nil, err
	}
	return model.NewSafetensorsWriter(path, specs)
}

// Snapshot copies the rank's shards into their pinned snapshot buffers
// and returns when the copies are done: the state of the step that just
// ended, which SaveSnapshot then writes while the rank trains on. It
// needs train.checkpoint_async, and the previous SaveSnapshot finished.
func (r *Rank) Snapshot() error {
	if err := r.settle(); err != nil {
		return err
	}
	list := r.shardTensors()
	r.snapped = nil
	for _, s := range list {
		if s.snap.Empty() {
			return fmt.Errorf("no snapshot buffer for %s (train.checkpoint_async is off)", s.name)
		}
		src, err := r.Arena.Readable(s.t)
		if err != nil {
			return err
		}
		if err := r.B.Copy(s.snap, src); err != nil {
			return fmt.Errorf("snapshot of %s: %w", s.name, err)
		}
	}
	if err := r.B.Sync(); err != nil {
		return err
	}
	r.snapped = list
	return nil
}

// SaveSnapshot writes the snapshot Snapshot took into checkpoint directory
// dir, in SaveShards' format. It reads only the snapshot's host memory, as
// stored (no conversion), and the list of tensors Snapshot made, not the
// rank's values, so it may run in the background while the rank computes
// (started after Snapshot returned); the next Snapshot must wait for it.
func (r *Rank) SaveSnapshot(dir string) error {
	list := r.snapped
	if list == nil {
		return errors.New("no snapshot to save")
	}
	w, err := newShardWriter(dir, r.ID, checkpointSpecs(list))
	if err != nil {
		return err
	}
	for _, s := range list {
		b, err := s.snap.HostBytes()
		if err == nil {
			err = w.WriteRaw(s.name, b)
		}
		if err != nil {
			w.Abort()
			return fmt.Errorf("saving %s: %w", s.name, err)
		}
	}
	return w.Close()
}

// download reads t as float32, from the host copy while the trainer
// sleeps.
func (r *Rank) download(dst []float32, t gpu.Tensor) error {
	t, err := r.Arena.Readable(t)
	if err != nil {
		return err
	}
	return r.B.Download(dst, t)
}

// LoadShards restores the rank's shards from checkpoint directory dir,
// written by SaveShards on a run of the same spec and mesh.
func (r *Rank) LoadShards(dir string) error {
	if err := r.settle(); err != nil {
		return err
	}
	ck, err := model.OpenCheckpoint(rankDir(dir, r.ID))
	if err != nil {
		return err
	}
	defer ck.Close()
	for _, s := range r.shardTensors() {
		info, _, ok := ck.Tensor(s.name)
		if !ok {
			return fmt.Errorf("checkpoint %s has no tensor %s (was it written for another spec or mesh?)", dir, s.name)
		}
		if info.NumElements() != int64(s.t.Numel()) {
			// A frozen model checkpointed replicated and sharded now, or
			// the other way round, is read across the layouts.
			err := r.loadOtherLayout(dir, s, info.NumElements())
			if err == nil {
				continue
			}
			if !errors.Is(err, errLayout) {
				return fmt.Errorf("checkpoint tensor %s: %w", s.name, err)
			}
			return fmt.Errorf("checkpoint tensor %s has %d elements, the shard %d (was it written for another spec or mesh?)", s.name, info.NumElements(), s.t.Numel())
		}
		data := make([]float32, s.t.Numel())
		if err := ck.ReadRows(s.name, 0, int64(len(data)), data); err != nil {
			return err
		}
		if err := r.B.Upload(s.t, data); err != nil {
			return err
		}
	}
	if err := r.B.Sync(); err != nil {
		return err
	}
	for _, st := range r.shards() {
		if err := st.refreshBF16(r.Host); err != nil {
			return err
		}
	}
	return nil
}

// shardRows downloads the rank's rows of every (untied) parameter of model
// name from the shard view returns (the params, or the fp32 grads or
// moments).
func (r *Rank) shardRows(name string, view func(st *ShardState, u *Unit, s model.Slot) (gpu.Tensor, error)) (ShardRows, error) {
	st := r.shards()[name]
	if st == nil {
		return nil, fmt.Errorf("model %q is not sharded on rank %d", name, r.ID)
	}
	if err := st.settle(); err != nil {
		return nil, err
	}
	out := ShardRows{}
	for _, u := range st.Units {
		for _, s := range u.Slots {
			if s.Tied {
				continue
			}
			t, err := view(st, u, s)
			if err != nil {
				return nil, err
			}
			data := make([]float32, t.Numel())
			if err := r.download(data, t); err != nil {
				return nil, err
			}
			out[s.Name] = data
		}
	}
	return out, nil
}

func mkdirAll(dir string) error { return os.MkdirAll(dir, 0o755) }
