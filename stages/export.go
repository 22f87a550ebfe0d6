package stages

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/model"
)

// ShardRows are one rank's rows of every parameter of a model, as fp32,
// keyed by HF name.
type ShardRows map[string][]float32

// ExportRows downloads the rank's rows of model name's parameters.
func (r *Rank) ExportRows(name string) (ShardRows, error) {
	return r.shardRows(name, func(st *ShardState, u *Unit, s model.Slot) (gpu.Tensor, error) { return st.paramShard(u, s) })
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

// ExportOptions says how an HF export is written.
type ExportOptions struct {
	// DType is the weights' dtype: bf16, fp16, fp32 or their HF names; ""
	// is the config's.
	DType string
	// MaxShardSize is the most bytes of tensor data in one safetensors file
	// (model.DefaultMaxShardSize, 5 GB, when 0): a larger model is written
	// as shards and an index, as transformers' save_pretrained does.
	MaxShardSize int64
}

// Exported says what an export wrote.
type Exported struct {
	Dir string
	// Weights are the names of the weight files: model.safetensors, or the
	// shards and model.safetensors.index.json.
	Weights []string
	// Source is the checkpoint directory the model was loaded from, whose
	// files besides the weights were copied; "" for a model loaded from
	// none.
	Source string
	// Copied are the names of the files copied from Source, sorted.
	Copied []string
}

// ErrSourceMissing is wrapped by the error of an export whose model's
// source checkpoint directory no longer exists.
var ErrSourceMissing = errors.New("source checkpoint directory missing")

// ExportHF assembles every rank's rows into full tensors and writes model m
// as an HF checkpoint into dir: config.json in the dialect of the source's,
// a copy of the source checkpoint directory's other files but the weights
// (tokenizer, generation config, ...), and the weights in one
// model.safetensors or, above opts.MaxShardSize, in shards with an index.
// It fails, wrapping ErrSourceMissing, when the source directory is gone.
func ExportHF(m *Model, dp int, ranks []ShardRows, dir string, opts ExportOptions) (*Exported, error) {
	return writeExport(m, dp, dir, opts, func(s model.Slot, full []float32) error {
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

// writeExport writes model m and its parameters as an HF checkpoint into
// dir: config.json (the source's in its own dialect, see
// model.Config.MarshalExport), a copy of every other file of the source
// checkpoint directory but the weights (tokenizer files,
// generation_config.json, chat template, README, ...: see sourceFiles),
// and the weights in opts.DType, in one model.safetensors or, above
// opts.MaxShardSize, in shards with an index (model.CheckpointWriter). Every
// file is written to a temporary file and renamed into place. The weights
// are streamed: fill sets one full tensor (of a slot of the layout over dp
// ranks) at a time, in the files' order, so host memory holds the largest
// tensor, not the model. A model whose source directory is gone is refused
// (wrapping ErrSourceMissing) before anything is written: without its
// tokenizer the export could not be served.
func writeExport(m *Model, dp int, dir string, opts ExportOptions, fill func(s model.Slot, full []float32) error) (*Exported, error) {
	cfg := m.Config
	dtype := opts.DType
	if dtype == "" {
		dtype = cfg.DType
	}
	dt, err := ExportDType(dtype)
	if err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	res := &Exported{Dir: dir, Source: m.Dir}
	var copies []string
	if m.Dir != "" {
		if copies, err = sourceFiles(m); err != nil {
			return nil, fmt.Errorf("export: %w", err)
		}
		if same(dir, m.Dir) {
			return nil, fmt.Errorf("export: the output directory %s is model %q's source checkpoint directory; name another", dir, m.Name())
		}
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
	js, err := out.MarshalExport()
	if err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	if err := mkdirAll(dir); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	if err := model.WriteFileAtomic(filepath.Join(dir, model.ConfigFileName), 0o644, func(w io.Writer) error {
		_, err := w.Write(js)
		return err
	}); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	for _, name := range copies {
		if err := copyFile(filepath.Join(dir, name), filepath.Join(m.Dir, name)); err != nil {
			return nil, fmt.Errorf("export: %w", err)
		}
		res.Copied = append(res.Copied, name)
	}
	w, err := model.NewCheckpointWriter(dir, specs, opts.MaxShardSize)
	if err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	buf := make([]float32, largest)
	for _, s := range slots {
		full := buf[:s.Elems()]
		if err := fill(s, full); err != nil {
			w.Abort()
			return nil, fmt.Errorf("export: %w", err)
		}
		if err := w.Write(s.Name, full); err != nil {
			w.Abort()
			return nil, fmt.Errorf("export: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	res.Weights = w.Files()
	return res, nil
}

// weightSuffixes end the names of the weight files HF checkpoint
// directories hold (safetensors, PyTorch, TensorFlow, Flax, GGUF, ONNX);
// an export writes its own weights and copies none of these, nor their
// index files (NAME.index.json), nor optimizer or trainer state saved
// beside them (optimizer.pt, training_args.bin, ...).
var weightSuffixes = []string{".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx"}

// isWeightFile reports whether a file named name holds weights, or an index
// of weight files.
func isWeightFile(name string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".index.json")
	for _, s := range weightSuffixes {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// sourceFiles lists the files of m's source checkpoint directory that an
// export copies, sorted: every regular file (or link to one, as in the
// Hugging Face cache) at its top level but config.json (which the export
// rewrites), weight files and hidden files. Subdirectories are not copied:
// transformers reads none of a checkpoint's from the checkpoint's own
// directory (they hold other formats, such as original/ or onnx/).
func sourceFiles(m *Model) ([]string, error) {
	entries, err := os.ReadDir(m.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("model %q was loaded from %s, which no longer exists (%w): "+
			"the export copies its tokenizer, generation config and other files besides the weights; restore the directory at that path",
			m.Name(), m.Dir, ErrSourceMissing)
	}
	if err != nil {
		return nil, fmt.Errorf("model %q's source checkpoint directory: %w", m.Name(), err)
	}
	var out []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || name == model.ConfigFileName || isWeightFile(name) {
			continue
		}
		fi, err := os.Stat(filepath.Join(m.Dir, name)) // follows links
		if err != nil {
			return nil, fmt.Errorf("model %q's source checkpoint directory: %w", m.Name(), err)
		}
		if fi.Mode().IsRegular() {
			out = append(out, name)
		}
	}
	return out, nil // os.ReadDir sorts
}

// copyFile copies the file src to dst, streamed, replacing dst atomically.
func copyFile(dst, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	return model.WriteFileAtomic(dst, 0o644, func(w io.Writer) error {
		_, err := io.Copy(w, f)
		return err
	})
}

// same reports whether paths a and b name the same existing directory.
func same(a, b string) bool {
	x, err := os.Stat(a)
	if err != nil {
		return false
	}
	y, err := os.Stat(b)
	return err == nil && os.SameFile(x, y)
}

// ExportCheckpoint writes model name of the job as an HF checkpoint from the
// committed checkpoint directory ckpt (written by SaveShards on every rank)
// into out, as ExportHF writes it. It reads the shard files on the host and
// needs no backend, so any checkpoint of a run can be exported after the
// fact; it streams, holding one full tensor in memory at a time.
func ExportCheckpoint(j *Job, name, ckpt, out string, opts ExportOptions) (*Exported, error) {
	m := j.Models[name]
	if m == nil {
		return nil, fmt.Errorf("export: no model %q", name)
	}
	dp := j.Spec.Mesh.WorldSize()
	if dp > 1 && replicaIn(ckpt, name, m) {
		dp = 1 // every rank holds all of it: rank 0's file has it whole
	}
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
			return nil, fmt.Errorf("export: %w", err)
		}
		cks[r] = ck
		for _, u := range units {
			tn := fmt.Sprintf("%s.params.%s", name, u.Name)
			info, _, ok := ck.Tensor(tn)
			if !ok {
				return nil, fmt.Errorf("export: checkpoint %s has no tensor %s (was model %q sharded in that run?)", rankDir(ckpt, r), tn, name)
			}
			if info.NumElements() != u.ShardElems {
				return nil, fmt.Errorf("export: checkpoint tensor %s has %d elements, the shard %d (another mesh?)", tn, info.NumElements(), u.ShardElems)
			}
		}
	}
	return writeExport(m, dp, out, opts, func(s model.Slot, full []float32) error {
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

// replicaIn reports whether checkpoint directory ckpt holds model m
// (named name) replicated (apply_fsdp2's replicate): rank 0's tensor of
// its first unit has the whole unit's elements.
func replicaIn(ckpt, name string, m *Model) bool {
	ck, err := model.OpenCheckpoint(rankDir(ckpt, 0))
	if err != nil {
		return false // the sharded path reports it
	}
	defer ck.Close()
	u := Units(m, 1)[0]
	info, _, ok := ck.Tensor(fmt.Sprintf("%s.params.%s", name, u.Name))
	return ok && info.NumElements() == u.ShardElems
}
