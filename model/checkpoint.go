package model

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/rlpipe/rlpipe/gpu"
)

// Errors wrapped by Checkpoint.Check and WriteCheckpoint.
var (
	ErrMissingTensor    = errors.New("missing tensor")
	ErrShapeMismatch    = errors.New("shape mismatch")
	ErrUnexpectedTensor = errors.New("unexpected tensor")
)

// Checkpoint file names.
const (
	SingleFileName = "model.safetensors"
	IndexFileName  = "model.safetensors.index.json"
	ConfigFileName = "config.json"
)

// Checkpoint is an opened HF checkpoint directory: the headers of its
// safetensors files and where each tensor lives. Tensor data is read on
// demand by ReadRows; Close releases the file handles it opened.
type Checkpoint struct {
	Dir   string
	Index string  // path of model.safetensors.index.json; "" for a single file
	Files []*File // one per safetensors file, sorted by path

	where   map[string]int // tensor name → index in Files
	mu      sync.Mutex
	handles map[int]*os.File
}

// OpenCheckpoint reads the safetensors headers of the checkpoint in dir:
// model.safetensors when present, otherwise the shards named by the
// weight_map of model.safetensors.index.json. Every tensor the index names
// must be in its shard, and every tensor of a shard must be named by the
// index. All problems found are joined into the returned error.
func OpenCheckpoint(dir string) (*Checkpoint, error) {
	single := filepath.Join(dir, SingleFileName)
	if _, err := os.Stat(single); err == nil {
		f, err := ReadHeader(single)
		if err != nil {
			return nil, err
		}
		ck := &Checkpoint{Dir: dir, Files: []*File{f}, where: map[string]int{}}
		for _, t := range f.Tensors {
			ck.where[t.Name] = 0
		}
		return ck, nil
	}
	index := filepath.Join(dir, IndexFileName)
	data, err := os.ReadFile(index)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: no %s or %s: %w", dir, SingleFileName, IndexFileName, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint index: %w", err)
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", index, ErrInvalidSafetensors, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%s: %w: weight_map is missing or empty", index, ErrInvalidSafetensors)
	}
	byShard := map[string][]string{}
	for name, shard := range idx.WeightMap {
		byShard[shard] = append(byShard[shard], name)
	}
	ck := &Checkpoint{Dir: dir, Index: index, where: map[string]int{}}
	var errs []error
	for _, shard := range sortedKeys(byShard) {
		if shard == "" || shard == "." || shard == ".." || filepath.Base(shard) != shard || strings.ContainsAny(shard, `/\`) {
			errs = append(errs, fmt.Errorf("%s: %w: shard name %q is not a plain file name", index, ErrInvalidSafetensors, shard))
			continue
		}
		f, err := ReadHeader(filepath.Join(dir, shard))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		fi := len(ck.Files)
		ck.Files = append(ck.Files, f)
		names := byShard[shard]
		sort.Strings(names)
		for _, name := range names {
			if _, ok := f.Tensor(name); !ok {
				errs = append(errs, fmt.Errorf("%s: %w %q listed for it in %s", f.Path, ErrMissingTensor, name, IndexFileName))
				continue
			}
			ck.where[name] = fi
		}
		for _, t := range f.Tensors {
			if idx.WeightMap[t.Name] != shard {
				errs = append(errs, fmt.Errorf("%s: %w %q is not mapped to this shard in %s", f.Path, ErrUnexpectedTensor, t.Name, IndexFileName))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return ck, nil
}

// Names returns the names of all tensors in the checkpoint, sorted.
func (ck *Checkpoint) Names() []string { return sortedKeys(ck.where) }

// Tensor returns the tensor called name and the file holding it.
func (ck *Checkpoint) Tensor(name string) (TensorInfo, *File, bool) {
	i, ok := ck.where[name]
	if !ok {
		return TensorInfo{}, nil, false
	}
	t, ok := ck.Files[i].Tensor(name)
	return t, ck.Files[i], ok
}

// Close closes the files opened by ReadRows. The checkpoint's headers stay
// usable, and a later ReadRows reopens files as needed.
func (ck *Checkpoint) Close() error {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	var errs []error
	for i, h := range ck.handles {
		errs = append(errs, h.Close())
		delete(ck.handles, i)
	}
	return errors.Join(errs...)
}

// Check cross-checks the checkpoint against the parameter inventory of c:
// every parameter must be present with the right shape and a loadable dtype
// (BF16, F16, F32). lm_head.weight is allowed extra when embeddings are
// tied, rotary inv_freq buffers are ignored, and any other tensor is an
// error. All problems are joined; each names the file and the tensor.
func (ck *Checkpoint) Check(c *Config) error {
	var refs []tensorRef
	for _, name := range ck.Names() {
		t, f, _ := ck.Tensor(name)
		refs = append(refs, tensorRef{name: name, dtype: t.DType, shape: t.Shape, file: f.Path})
	}
	where := ck.Index
	if where == "" && len(ck.Files) == 1 {
		where = ck.Files[0].Path
	}
	if where == "" {
		where = ck.Dir
	}
	return checkTensors(c, where, refs)
}

type tensorRef struct {
	name, dtype, file string
	shape             []int64
}

// checkTensors compares tensors (sorted by name) with the inventory of c.
// where names the checkpoint in errors about missing tensors.
func checkTensors(c *Config, where string, refs []tensorRef) error {
	inv := c.inventory()
	var errs []error
	seen := map[string]bool{}
	for _, r := range refs {
		seen[r.name] = true
		want, ok := inv[r.name]
		if !ok {
			switch {
			case strings.HasSuffix(r.name, "rotary_emb.inv_freq"):
			case r.name == "lm_head.weight" && c.TieWordEmbeddings:
			default:
				errs = append(errs, fmt.Errorf("%s: %w %q: not a parameter of %s", r.file, ErrUnexpectedTensor, r.name, c.Family))
			}
			continue
		}
		if !slices.Equal(r.shape, want) {
			errs = append(errs, fmt.Errorf("%s: tensor %q: %w: got %v, want %v", r.file, r.name, ErrShapeMismatch, r.shape, want))
		}
		if !loadable(r.dtype) {
			errs = append(errs, fmt.Errorf("%s: tensor %q: %w dtype %s (supported: BF16, F16, F32)", r.file, r.name, ErrUnsupported, r.dtype))
		}
	}
	for _, u := range c.Units() {
		for _, p := range u.Params {
			if !seen[p.Name] {
				errs = append(errs, fmt.Errorf("%s: %w %q", where, ErrMissingTensor, p.Name))
			}
		}
	}
	return errors.Join(errs...)
}

func (ck *Checkpoint) handle(fi int) (*os.File, error) {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	if h, ok := ck.handles[fi]; ok {
		return h, nil
	}
	h, err := os.Open(ck.Files[fi].Path)
	if err != nil {
		return nil, fmt.Errorf("open safetensors: %w", err)
	}
	if ck.handles == nil {
		ck.handles = map[int]*os.File{}
	}
	ck.handles[fi] = h
	return h, nil
}

// rowSpan is where rows of one tensor are: its file, its header entry, the
// open file, and its elements per row and bytes per element.
type rowSpan struct {
	f               *File
	t               TensorInfo
	h               *os.File
	rowElems, esize int64
}

// rowRange checks a read of rows [row0, row1) of tensor name into a
// destination of n units (elements when unit is 1, bytes when it is 0: the
// element size) and opens the tensor's file when n > 0.
func (ck *Checkpoint) rowRange(name string, row0, row1, n, unit int64, units string) (rowSpan, error) {
	fi, ok := ck.where[name]
	if !ok {
		return rowSpan{}, fmt.Errorf("%s: %w %q", ck.Dir, ErrMissingTensor, name)
	}
	f := ck.Files[fi]
	t, _ := f.Tensor(name)
	if !loadable(t.DType) {
		return rowSpan{}, fmt.Errorf("%s: tensor %q: %w dtype %s (supported: BF16, F16, F32)", f.Path, name, ErrUnsupported, t.DType)
	}
	r := rowSpan{f: f, t: t, rowElems: 1, esize: int64(DTypeSize(t.DType))}
	rows := int64(1)
	if len(t.Shape) > 0 {
		rows, r.rowElems = t.Shape[0], numElements(t.Shape[1:])
	}
	if row0 < 0 || row1 < row0 || row1 > rows {
		return rowSpan{}, fmt.Errorf("%s: tensor %q: rows [%d, %d) out of range [0, %d)", f.Path, name, row0, row1, rows)
	}
	if unit == 0 {
		unit = r.esize
	}
	if want := (row1 - row0) * r.rowElems * unit; n != want {
		return rowSpan{}, fmt.Errorf("%s: tensor %q: dst has %d %s, rows [%d, %d) need %d", f.Path, name, n, units, row0, row1, want)
	}
	if n > 0 {
		h, err := ck.handle(fi)
		if err != nil {
			return rowSpan{}, err
		}
		r.h = h
	}
	return r, nil
}

// readChunk is the most bytes ReadRows reads at once.
const readChunk = 1 << 20

// ReadRows reads rows [row0, row1) along dimension 0 of the tensor called
// name into dst, converting BF16, F16 or F32 to float32. Only those rows are
// read from disk, in chunks of at most 1 MiB, so memory use is bounded by
// dst. len(dst) must be (row1-row0) times the product of the remaining
// dimensions. A 0-dimensional tensor has one row of one element. ReadRows is
// safe for concurrent use.
func (ck *Checkpoint) ReadRows(name string, row0, row1 int64, dst []float32) error {
	r, err := ck.rowRange(name, row0, row1, int64(len(dst)), 1, "elements")
	if err != nil || len(dst) == 0 {
		return err
	}
	f, t, h, esize := r.f, r.t, r.h, r.esize
	off := f.DataStart() + t.Begin + row0*r.rowElems*esize
	remaining := int64(len(dst)) * esize
	buf := make([]byte, min(remaining, readChunk))
	out := dst
	for remaining > 0 {
		n := min(remaining, int64(len(buf)))
		b := buf[:n]
		if _, err := h.ReadAt(b, off); err != nil {
			return fmt.Errorf("%s: tensor %q: read: %w", f.Path, name, err)
		}
		switch t.DType {
		case BF16:
			for i := range len(b) / 2 {
				out[i] = bf16ToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
			}
		case F16:
			for i := range len(b) / 2 {
				out[i] = f16ToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
			}
		default:
			for i := range len(b) / 4 {
				out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
			}
		}
		out = out[n/esize:]
		off += n
		remaining -= n
	}
	return nil
}

// rawReaders and rawPiece bound the concurrent reads of ReadRowsRaw: a read
// is split into pieces of at least rawPiece bytes, at most rawReaders at
// once. One reader copies from the page cache at a few GB/s; several
// reach the memory bandwidth, or keep a fast disk's queue full.
// (Variables so that tests can make pieces small.)
var (
	rawReaders = 8
	rawPiece   = 16 << 20
)

// StoredDType returns the dtype tensor name is stored in, as the device
// holds it: BF16, F16 or F32.
func (ck *Checkpoint) StoredDType(name string) (gpu.DType, error) {
	fi, ok := ck.where[name]
	if !ok {
		return 0, fmt.Errorf("%s: %w %q", ck.Dir, ErrMissingTensor, name)
	}
	f := ck.Files[fi]
	t, _ := f.Tensor(name)
	switch t.DType {
	case BF16:
		return gpu.BF16, nil
	case F16:
		return gpu.F16, nil
	case F32:
		return gpu.F32, nil
	}
	return 0, fmt.Errorf("%s: tensor %q: %w dtype %s (supported: BF16, F16, F32)", f.Path, name, ErrUnsupported, t.DType)
}

// ReadRowsRaw reads rows [row0, row1) along dimension 0 of the tensor
// called name into dst as stored: little-endian elements of the dtype
// StoredDType reports, with no conversion, in one read. len(dst) must be
// (row1-row0) times the product of the remaining dimensions times the
// element size. It is safe for concurrent use.
func (ck *Checkpoint) ReadRowsRaw(name string, row0, row1 int64, dst []byte) error {
	r, err := ck.rowRange(name, row0, row1, int64(len(dst)), 0, "bytes")
	if err != nil || len(dst) == 0 {
		return err
	}
	f, t, h, rowElems, esize := r.f, r.t, r.h, r.rowElems, r.esize
	base := f.DataStart() + t.Begin + row0*rowElems*esize
	pieces := min(rawReaders, max(1, len(dst)/rawPiece))
	size := (len(dst) + pieces - 1) / pieces
	errs := make([]error, pieces)
	var wg sync.WaitGroup
	for i := range pieces {
		lo, hi := i*size, min((i+1)*size, len(dst))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := h.ReadAt(dst[lo:hi], base+int64(lo)); err != nil {
				errs[i] = fmt.Errorf("%s: tensor %q: read: %w", f.Path, name, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// WriteCheckpoint writes a checkpoint directory for c: config.json in the
// transformers 4 dialect and model.safetensors holding tensors. The tensors
// are checked against the inventory of c first, as Check would; dir is
// created when missing.
func WriteCheckpoint(dir string, c *Config, tensors []Tensor) error {
	cfg, err := c.MarshalHF()
	if err != nil {
		return err
	}
	refs := make([]tensorRef, 0, len(tensors))
	for _, t := range tensors {
		dt, ok := CanonicalDType(t.DType)
		if !ok {
			dt = t.DType
		}
		refs = append(refs, tensorRef{name: t.Name, dtype: dt, shape: t.Shape, file: "tensors"})
	}
	sort.Slice(refs, func(a, b int) bool { return refs[a].name < refs[b].name })
	if err := checkTensors(c, "tensors", refs); err != nil {
		return fmt.Errorf("write checkpoint %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ConfigFileName), cfg, 0o644); err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	return WriteSafetensors(filepath.Join(dir, SingleFileName), tensors)
}

// RandomTensors returns a deterministic random initialisation of every
// parameter of c, in inventory order, stored as the config's dtype: weight
// matrices and embeddings are normal with standard deviation std, norm
// weights are 1, and biases are normal with standard deviation std/10. It is
// meant for tiny test checkpoints; memory use is the full model in float32.
func RandomTensors(c *Config, seed int64, std float64) []Tensor {
	dt, ok := CanonicalDType(c.DType)
	if !ok || !loadable(dt) {
		dt = F32
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x726c7069706521))
	var out []Tensor
	for _, u := range c.Units() {
		for _, p := range u.Params {
			data := make([]float32, p.NumElements())
			switch {
			case strings.HasSuffix(p.Name, "norm.weight"):
				for i := range data {
					data[i] = 1
				}
			case strings.HasSuffix(p.Name, ".bias"):
				for i := range data {
					data[i] = float32(rng.NormFloat64() * std / 10)
				}
			default:
				for i := range data {
					data[i] = float32(rng.NormFloat64() * std)
				}
			}
			out = append(out, Tensor{Name: p.Name, DType: dt, Shape: slices.Clone(p.Shape), Data: data})
		}
	}
	return out
}
