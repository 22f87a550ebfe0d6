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
// rank's state, and its view of the model's snapshot (empty without
// train.checkpoint_async).
type shardTensor struct {
	name    string
	t, snap gpu.Tensor
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
				s := shardTensor{name: fmt.Sprintf("%s.%s.%s", n, kind, u.Name), t: t}
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
			return fmt.Errorf("checkpoint tensor %s has %d elements, the shard %d", s.name, info.NumElements(), s.t.Numel())
		}
		data := make([]float32, s.t.Numel())
		if err := ck.ReadRows(s.name, 0, int64(len(data)), data); err != nil {
			return err
		}
		if err := r.B.Upload(s.t, data); err != nil {
			return err
		}
	}
	return nil
}

// ShardRows are one rank's rows of every parameter of a model, as fp32,
// keyed by HF name.
type ShardRows map[string][]float32

// ExportRows downloads the rank's rows of model name's parameters.
func (r *Rank) ExportRows(name string) (ShardRows, error) {
	return r.shardRows(name, func(st *ShardState, u *Unit, s model.Slot) (gpu.Tensor, error) { return st.paramShard(u, s) })
}

// shardRows downloads the rank's rows of every (untied) parameter of model
// name from the shard view returns (the params, or the fp32 grads or
// moments).
func (r *Rank) shardRows(name string, view func(st *ShardState, u *Unit, s model.Slot) (gpu.Tensor, error)) (ShardRows, error) {
	st := r.shards()[name]
	if st == nil {
		return nil, fmt.Errorf("model %q is not sharded on rank %d", name, r.ID)
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

// ExportDType returns the safetensors dtype (F32, BF16 or F16) of an export
// dtype given as bf16, fp16, fp32 or their HF names (bfloat16, ...).
func ExportDType(dtype string) (string, error) {
	dt, ok := model.CanonicalDType(dtype)
	switch {
	case ok && (dt == model.F32 || dt == model.BF16 || dt == model.F16):
		return dt, nil
	case ok:
		return "", fmt.Errorf("dtype %q: an HF export holds floating-point weights: bf16, fp16 or fp32", dtype)
	}
	return "", fmt.Errorf("unknown dtype %q (bf16, fp16, fp32)", dtype)
}

// ExportHF assembles every rank's rows into full tensors and writes model m
// as an HF checkpoint (config.json + model.safetensors) in dtype (the
// config's dtype when empty) into dir.
func ExportHF(m *Model, dp int, ranks []ShardRows, dir, dtype string) error {
	return writeExport(m.Config, dp, dir, dtype, func(s model.Slot, full []float32) error {
		var n int64
		for r := 0; r < dp && n < s.Elems(); r++ {
			rows := ranks[r][s.Name]
			if rows == nil {
				return fmt.Errorf("rank %d has no rows of %s", r, s.Name)
			}
			n += int64(copy(full[n:], rows))
		}
		return nil
	})
}

// writeExport writes config cfg and its parameters as an HF checkpoint in
// dtype into dir, streamed: fill sets one full tensor (of a slot of the
// layout over dp ranks) at a time, in the file's order, so host memory
// holds the largest tensor, not the model.
func writeExport(cfg *model.Config, dp int, dir, dtype string, fill func(s model.Slot, full []float32) error) error {
	if dtype == "" {
		dtype = cfg.DType
	}
	dt, err := ExportDType(dtype)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	var slots []model.Slot
	var specs []model.TensorSpec
	var largest int64
	for _, u := range cfg.Units() {
		for _, s := range cfg.Layout(u, dp) {
			if !s.Tied {
				slots = append(slots, s)
				specs = append(specs, model.TensorSpec{Name: s.Name, DType: dt, Shape: s.Shape})
				largest = max(largest, s.Elems())
			}
		}
	}
	out := *cfg
	out.DType = map[string]string{model.F32: "float32", model.BF16: "bfloat16", model.F16: "float16"}[dt]
	js, err := out.MarshalHF()
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := mkdirAll(dir); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, model.ConfigFileName), js, 0o644); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	w, err := model.NewSafetensorsWriter(filepath.Join(dir, model.SingleFileName), specs)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	buf := make([]float32, largest)
	for _, s := range slots {
		full := buf[:s.Elems()]
		if err := fill(s, full); err != nil {
			w.Abort()
			return fmt.Errorf("export: %w", err)
		}
		if err := w.Write(s.Name, full); err != nil {
			w.Abort()
			return fmt.Errorf("export: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	return nil
}

func mkdirAll(dir string) error { return os.MkdirAll(dir, 0o755) }

// ExportCheckpoint writes model name of the job as an HF checkpoint from the
// committed checkpoint directory ckpt (written by SaveShards on every rank)
// into out, in dtype (the config's when empty). It reads the shard files on
// the host and needs no backend, so any checkpoint of a run can be exported
// after the fact; it streams, holding one full tensor in memory at a time.
func ExportCheckpoint(j *Job, name, ckpt, out, dtype string) error {
	m := j.Models[name]
	if m == nil {
		return fmt.Errorf("export: no model %q", name)
	}
	dp := j.Spec.Mesh.WorldSize()
	cks := make([]*model.Checkpoint, dp)
	defer func() {
		for _, ck := range cks {
			if ck != nil {
				ck.Close()
			}
		}
	}()
	units := Units(m, dp)
	where := map[string]*Unit{} // the unit holding each parameter
	for _, u := range units {
		for _, s := range u.Slots {
			if !s.Tied { // a tied slot names the weight another unit holds
				where[s.Name] = u
			}
		}
	}
	for r := range dp {
		ck, err := model.OpenCheckpoint(rankDir(ckpt, r))
		if err != nil {
			return fmt.Errorf("export: %w", err)
		}
		cks[r] = ck
		for _, u := range units {
			tn := fmt.Sprintf("%s.params.%s", name, u.Name)
			info, _, ok := ck.Tensor(tn)
			if !ok {
				return fmt.Errorf("export: checkpoint %s has no tensor %s (was model %q sharded in that run?)", rankDir(ckpt, r), tn, name)
			}
			if info.NumElements() != u.ShardElems {
				return fmt.Errorf("export: checkpoint tensor %s has %d elements, the shard %d (another mesh?)", tn, info.NumElements(), u.ShardElems)
			}
		}
	}
	return writeExport(m.Config, dp, out, dtype, func(s model.Slot, full []float32) error {
		tn := fmt.Sprintf("%s.params.%s", name, where[s.Name].Name)
		var n int64
		for r := 0; r < dp && n < s.Elems(); r++ {
			k := min(s.ShardElems(), s.Elems()-n)
			if err := cks[r].ReadRows(tn, s.ShardOffset, s.ShardOffset+k, full[n:n+k]); err != nil {
				return err
			}
			n += k
		}
		return nil
	})
}
