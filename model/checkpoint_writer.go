package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
)

// DefaultMaxShardSize is the most bytes of tensor data a CheckpointWriter
// puts into one safetensors file unless told otherwise: 5 GB, the default
// of save_pretrained in transformers 4.
const DefaultMaxShardSize int64 = 5_000_000_000

// ShardFileName is the name of shard i (from 1) of n of a sharded
// checkpoint, as transformers names them: model-00001-of-00003.safetensors.
func ShardFileName(i, n int) string { return fmt.Sprintf("model-%05d-of-%05d.safetensors", i, n) }

// shardFilePattern matches ShardFileName's names.
var shardFilePattern = regexp.MustCompile(`^model-[0-9]{5}-of-[0-9]{5}\.safetensors$`)

// ShardIndex is the content of model.safetensors.index.json.
type ShardIndex struct {
	Metadata struct {
		TotalSize int64 `json:"total_size"` // bytes of tensor data in all shards
	} `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"` // tensor name → shard file name
}

// CheckpointWriter streams the weights of an HF checkpoint directory laid
// out as transformers' save_pretrained lays them out: one
// model.safetensors when the tensors' data fit in the maximum shard size,
// otherwise shards named by ShardFileName and the index
// model.safetensors.index.json. Tensors go into the shards in the specs'
// order and are never split: a shard ends where the next tensor would take
// it past the limit, and a tensor larger than the limit gets a shard of its
// own. One shard is open at a time; each appears at its path only when it
// is complete, and the index only after every shard, so a directory with
// the index in place has all its shards.
type CheckpointWriter struct {
	dir    string
	files  []string       // the file name of each shard
	shards [][]TensorSpec // the tensors of each shard, in order
	index  ShardIndex
	cur    int // the shard being written
	done   int // tensors of shard cur written
	w      *SafetensorsWriter
}

// NewCheckpointWriter splits specs into shards of at most maxShardSize
// bytes of data (DefaultMaxShardSize when 0) and checks them as
// NewSafetensorsWriter does; dir must exist. Nothing is written until the
// first Write.
func NewCheckpointWriter(dir string, specs []TensorSpec, maxShardSize int64) (*CheckpointWriter, error) {
	if maxShardSize == 0 {
		maxShardSize = DefaultMaxShardSize
	}
	if maxShardSize < 0 {
		return nil, fmt.Errorf("write checkpoint %s: max shard size %d is negative", dir, maxShardSize)
	}
	cw := &CheckpointWriter{dir: dir, index: ShardIndex{WeightMap: map[string]string{}}}
	var size int64 // of the last shard
	for _, t := range specs {
		dt, ok := CanonicalDType(t.DType)
		if !ok || !loadable(dt) {
			return nil, fmt.Errorf("write checkpoint %s: tensor %q: %w dtype %q (supported: BF16, F16, F32)", dir, t.Name, ErrUnsupported, t.DType)
		}
		n := numElements(t.Shape) * int64(DTypeSize(dt))
		last := len(cw.shards) - 1
		// A new shard when there is none, when this tensor would take the
		// last past the limit, or when the last holds a tensor larger than
		// the limit on its own.
		if last < 0 || (len(cw.shards[last]) > 0 && size+n > maxShardSize) {
			cw.shards = append(cw.shards, nil)
			last, size = last+1, 0
		}
		cw.shards[last] = append(cw.shards[last], t)
		size += n
		cw.index.Metadata.TotalSize += n
	}
	if len(cw.shards) == 0 {
		cw.shards = [][]TensorSpec{nil}
	}
	for i, sh := range cw.shards {
		name := SingleFileName
		if len(cw.shards) > 1 {
			name = ShardFileName(i+1, len(cw.shards))
		}
		cw.files = append(cw.files, name)
		for _, t := range sh {
			if _, dup := cw.index.WeightMap[t.Name]; dup {
				return nil, fmt.Errorf("write checkpoint %s: duplicate tensor %q", dir, t.Name)
			}
			cw.index.WeightMap[t.Name] = name
		}
	}
	return cw, nil
}

// Sharded reports whether the checkpoint has more than one shard (and so
// an index).
func (cw *CheckpointWriter) Sharded() bool { return len(cw.shards) > 1 }

// Files returns the names of the files the checkpoint consists of: its
// shards in order, then the index when sharded.
func (cw *CheckpointWriter) Files() []string {
	out := append([]string(nil), cw.files...)
	if cw.Sharded() {
		out = append(out, IndexFileName)
	}
	return out
}

// TotalSize is the number of bytes of tensor data in all shards.
func (cw *CheckpointWriter) TotalSize() int64 { return cw.index.Metadata.TotalSize }

// Write appends the data of the next tensor, which must be name, converted
// to its dtype, opening its shard first and closing it after its last
// tensor.
func (cw *CheckpointWriter) Write(name string, data []float32) error {
	if cw.cur >= len(cw.shards) {
		return fmt.Errorf("write checkpoint %s: tensor %q: every tensor is written", cw.dir, name)
	}
	if cw.w == nil {
		w, err := NewSafetensorsWriter(filepath.Join(cw.dir, cw.files[cw.cur]), cw.shards[cw.cur])
		if err != nil {
			return err
		}
		cw.w = w
	}
	if err := cw.w.Write(name, data); err != nil {
		return err
	}
	cw.done++
	if cw.done == len(cw.shards[cw.cur]) {
		return cw.closeShard()
	}
	return nil
}

// closeShard closes shard cur and moves on to the next.
func (cw *CheckpointWriter) closeShard() error {
	w := cw.w
	cw.w = nil
	if err := w.Close(); err != nil {
		return err
	}
	cw.cur++
	cw.done = 0
	return nil
}

// Close checks that every tensor was written, writes the index of a
// sharded checkpoint, and then removes the weight files of an earlier
// checkpoint in the directory that this one did not write
// (model.safetensors, the index, shards of another count): loaders take
// model.safetensors over the index, and would read stale weights. The
// stale model.safetensors goes before the index is written, the other
// files after, so that the directory never holds a complete index beside a
// model.safetensors.
func (cw *CheckpointWriter) Close() error {
	if cw.cur < len(cw.shards) && len(cw.shards[cw.cur]) == 0 { // no tensors at all
		w, err := NewSafetensorsWriter(filepath.Join(cw.dir, cw.files[cw.cur]), nil)
		if err != nil {
			return err
		}
		cw.w = w
		if err := cw.closeShard(); err != nil {
			return err
		}
	}
	if cw.cur < len(cw.shards) {
		cw.Abort()
		return fmt.Errorf("write checkpoint %s: shard %s has %d of %d tensors written", cw.dir, cw.files[cw.cur], cw.done, len(cw.shards[cw.cur]))
	}
	if !cw.Sharded() {
		return cw.removeStale()
	}
	if err := os.Remove(filepath.Join(cw.dir, SingleFileName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("write checkpoint %s: remove the stale %s: %w", cw.dir, SingleFileName, err)
	}
	js, err := json.MarshalIndent(cw.index, "", "  ")
	if err != nil {
		return fmt.Errorf("write checkpoint %s: encode index: %w", cw.dir, err)
	}
	js = append(js, '\n')
	if err := WriteFileAtomic(filepath.Join(cw.dir, IndexFileName), 0o644, func(w io.Writer) error {
		_, err := w.Write(js)
		return err
	}); err != nil {
		return fmt.Errorf("write checkpoint %s: %w", cw.dir, err)
	}
	return cw.removeStale()
}

// removeStale removes the weight files in the directory that are not the
// checkpoint's.
func (cw *CheckpointWriter) removeStale() error {
	entries, err := os.ReadDir(cw.dir)
	if err != nil {
		return fmt.Errorf("write checkpoint %s: %w", cw.dir, err)
	}
	ours := map[string]bool{}
	for _, f := range cw.Files() {
		ours[f] = true
	}
	var errs []error
	for _, e := range entries {
		n := e.Name()
		if ours[n] || !(n == SingleFileName || n == IndexFileName || shardFilePattern.MatchString(n)) {
			continue
		}
		if err := os.Remove(filepath.Join(cw.dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("write checkpoint %s: remove the stale %s: %w", cw.dir, n, err))
		}
	}
	return errors.Join(errs...)
}

// Abort removes the open shard's temporary file. Shards already closed
// stay; the index is not written.
func (cw *CheckpointWriter) Abort() {
	if cw.w != nil {
		cw.w.Abort()
		cw.w = nil
	}
}

// WriteFileAtomic writes the file at path with write: into a temporary
// file in the same directory, which is given mode perm, synced, and renamed
// over path, so that path holds either what it held or all of the new
// content. On failure the temporary file is removed.
func WriteFileAtomic(path string, perm os.FileMode, write func(w io.Writer) error) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err = write(f); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = f.Chmod(perm); err == nil {
		if err = f.Sync(); err == nil {
			err = f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
