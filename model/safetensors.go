package model

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
)

// ErrInvalidSafetensors is wrapped by every error about a malformed or
// truncated safetensors file or index.
var ErrInvalidSafetensors = errors.New("invalid safetensors file")

// maxHeaderLen bounds the JSON header, as the reference implementation does.
const maxHeaderLen = 100 << 20

// TensorInfo describes one tensor of a safetensors file. Begin and End are
// the data_offsets, relative to the start of the data region.
type TensorInfo struct {
	Name  string
	DType string // safetensors spelling: "BF16", "F16", "F32", ...
	Shape []int64
	Begin int64
	End   int64
}

// NumElements returns the number of elements of the tensor.
func (t TensorInfo) NumElements() int64 { return numElements(t.Shape) }

// File is the parsed header of one safetensors file.
type File struct {
	Path      string
	Size      int64 // file size in bytes
	HeaderLen int64 // length of the JSON header
	Metadata  map[string]string
	Tensors   []TensorInfo // sorted by name
	index     map[string]int
}

// DataStart returns the file offset of the data region.
func (f *File) DataStart() int64 { return 8 + f.HeaderLen }

// Tensor returns the tensor called name.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	i, ok := f.index[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.Tensors[i], true
}

// ReadHeader reads and validates the header of the safetensors file at
// path without reading tensor data: the header length must fit the file,
// the header must be a JSON object of tensors (plus optional __metadata__),
// every dtype must be known, every tensor's byte length must match its dtype
// and shape, and the tensors must tile the data region exactly, so a
// truncated file is detected from its size.
func ReadHeader(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open safetensors: %w", err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat safetensors: %w", err)
	}
	return parseHeader(path, fh, st.Size())
}

func parseHeader(path string, r io.ReaderAt, size int64) (*File, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s: %w: %s", path, ErrInvalidSafetensors, fmt.Sprintf(format, args...))
	}
	var lenBuf [8]byte
	if size < 8 {
		return nil, bad("file is %d bytes, shorter than the 8-byte header length", size)
	}
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("%s: read header length: %w", path, err)
	}
	hlen := binary.LittleEndian.Uint64(lenBuf[:])
	if hlen > maxHeaderLen {
		return nil, bad("header length %d exceeds the %d-byte limit", hlen, maxHeaderLen)
	}
	if int64(hlen) > size-8 {
		return nil, bad("header length %d exceeds the %d bytes after the length prefix", hlen, size-8)
	}
	hdr := make([]byte, hlen)
	if _, err := r.ReadAt(hdr, 8); err != nil {
		return nil, fmt.Errorf("%s: read header: %w", path, err)
	}
	if len(hdr) == 0 || hdr[0] != '{' {
		return nil, bad("header is not a JSON object")
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &raw); err != nil {
		return nil, bad("header JSON: %v", err)
	}
	f := &File{Path: path, Size: size, HeaderLen: int64(hlen), index: map[string]int{}}
	for _, name := range sortedKeys(raw) {
		if name == "__metadata__" {
			if err := json.Unmarshal(raw[name], &f.Metadata); err != nil {
				return nil, bad("__metadata__ must map strings to strings: %v", err)
			}
			continue
		}
		var e struct {
			DType       *string  `json:"dtype"`
			Shape       *[]int64 `json:"shape"`
			DataOffsets []int64  `json:"data_offsets"`
		}
		if err := json.Unmarshal(raw[name], &e); err != nil {
			return nil, bad("tensor %q: %v", name, err)
		}
		if e.DType == nil || e.Shape == nil || e.DataOffsets == nil {
			return nil, bad("tensor %q: needs dtype, shape and data_offsets", name)
		}
		bits, ok := safetensorsBits[*e.DType]
		if !ok {
			return nil, bad("tensor %q: unknown dtype %q", name, *e.DType)
		}
		if len(e.DataOffsets) != 2 {
			return nil, bad("tensor %q: data_offsets has %d entries, want 2", name, len(e.DataOffsets))
		}
		t := TensorInfo{Name: name, DType: *e.DType, Shape: *e.Shape, Begin: e.DataOffsets[0], End: e.DataOffsets[1]}
		if t.Shape == nil {
			t.Shape = []int64{}
		}
		elems := int64(1)
		for _, d := range t.Shape {
			if d < 0 {
				return nil, bad("tensor %q: negative dimension in shape %v", name, t.Shape)
			}
			if d != 0 && elems > (math.MaxInt64/64)/d {
				return nil, bad("tensor %q: shape %v is too large", name, t.Shape)
			}
			elems *= d
		}
		if t.Begin < 0 || t.End < t.Begin {
			return nil, bad("tensor %q: bad data_offsets [%d, %d]", name, t.Begin, t.End)
		}
		if elems*int64(bits)%8 != 0 {
			return nil, bad("tensor %q: %d elements of %s do not fill whole bytes", name, elems, t.DType)
		}
		if want := elems * int64(bits) / 8; t.End-t.Begin != want {
			return nil, bad("tensor %q: data_offsets [%d, %d] span %d bytes, but %s %v needs %d",
				name, t.Begin, t.End, t.End-t.Begin, t.DType, t.Shape, want)
		}
		f.index[name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, t)
	}

	// The tensors must tile the data region: sorted by offset, each begins
	// where the previous one ended, and the last ends at the end of file.
	order := make([]int, len(f.Tensors))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool {
		ta, tb := f.Tensors[order[a]], f.Tensors[order[b]]
		if ta.Begin != tb.Begin {
			return ta.Begin < tb.Begin
		}
		return ta.End < tb.End
	})
	dataLen := size - f.DataStart()
	var cursor int64
	for _, i := range order {
		t := f.Tensors[i]
		switch {
		case t.Begin > cursor:
			return nil, bad("tensor %q: gap in data region: begins at %d, previous tensor ends at %d", t.Name, t.Begin, cursor)
		case t.Begin < cursor:
			return nil, bad("tensor %q: data_offsets [%d, %d] overlap the previous tensor ending at %d", t.Name, t.Begin, t.End, cursor)
		}
		if t.End > dataLen {
			return nil, bad("tensor %q: data_offsets [%d, %d] extend past the end of the data region (%d bytes): file truncated",
				t.Name, t.Begin, t.End, dataLen)
		}
		cursor = t.End
	}
	if cursor != dataLen {
		return nil, bad("%d bytes of data after the last tensor", dataLen-cursor)
	}
	return f, nil
}

// Tensor is an in-memory tensor for WriteSafetensors. DType is the dtype it
// is stored as ("BF16", "F16", "F32" or an alias such as "bf16"); Data holds
// the values in row-major order.
type Tensor struct {
	Name  string
	DType string
	Shape []int64
	Data  []float32
}

// WriteSafetensors writes tensors to a safetensors file at path, converting
// each to its dtype (bf16 and f16 with round-to-nearest-even). Tensors are
// stored in name order and the header is padded to 8 bytes, so the output
// depends only on the tensors. The file is written to a temporary name and
// renamed into place.
func WriteSafetensors(path string, tensors []Tensor) error {
	ts := make([]Tensor, len(tensors))
	copy(ts, tensors)
	sort.Slice(ts, func(a, b int) bool { return ts[a].Name < ts[b].Name })
	infos := make([]TensorSpec, len(ts))
	for i, t := range ts {
		infos[i] = TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape}
	}
	w, err := NewSafetensorsWriter(path, infos)
	if err != nil {
		return err
	}
	for _, t := range ts {
		if err := w.Write(t.Name, t.Data); err != nil {
			w.Abort()
			return err
		}
	}
	return w.Close()
}
