package model

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
)

// TensorSpec names a tensor of a safetensors file before its data exists.
type TensorSpec struct {
	Name  string
	DType string // BF16, F16 or F32 (or an alias such as bf16)
	Shape []int64
}

// SafetensorsWriter streams a safetensors file: the header, from the
// tensors' specs, first, then each tensor's data in the specs' order, so
// that a model larger than host memory can be written one piece at a time.
// The file appears at its path only when Close succeeds (it is written to
// a temporary file in the same directory, synced and renamed).
type SafetensorsWriter struct {
	path  string
	tmp   *os.File
	w     *bufio.Writer
	specs []TensorSpec
	next  int
	buf   []byte // one chunk of encoded data
}

// writeChunk is the number of elements Write encodes at a time.
const writeChunk = 1 << 22

// NewSafetensorsWriter checks the specs (names unique and not
// "__metadata__", dtypes BF16, F16 or F32, dimensions ≥ 0) and writes the
// header.
func NewSafetensorsWriter(path string, specs []TensorSpec) (*SafetensorsWriter, error) {
	header := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var offset int64
	own := make([]TensorSpec, len(specs))
	for i, t := range specs {
		if t.Name == "" || t.Name == "__metadata__" {
			return nil, fmt.Errorf("write %s: invalid tensor name %q", path, t.Name)
		}
		if _, dup := header[t.Name]; dup {
			return nil, fmt.Errorf("write %s: duplicate tensor %q", path, t.Name)
		}
		dt, ok := CanonicalDType(t.DType)
		if !ok || !loadable(dt) {
			return nil, fmt.Errorf("write %s: tensor %q: %w dtype %q (supported: BF16, F16, F32)", path, t.Name, ErrUnsupported, t.DType)
		}
		for _, d := range t.Shape {
			if d < 0 {
				return nil, fmt.Errorf("write %s: tensor %q: negative dimension in shape %v", path, t.Name, t.Shape)
			}
		}
		shape := t.Shape
		if shape == nil {
			shape = []int64{}
		}
		size := numElements(shape) * int64(DTypeSize(dt))
		header[t.Name] = map[string]any{"dtype": dt, "shape": shape, "data_offsets": []int64{offset, offset + size}}
		offset += size
		own[i] = TensorSpec{Name: t.Name, DType: dt, Shape: shape}
	}
	hdr, err := json.Marshal(header)
	if err != nil {
		return nil, fmt.Errorf("write %s: encode header: %w", path, err)
	}
	for len(hdr)%8 != 0 {
		hdr = append(hdr, ' ')
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return nil, fmt.Errorf("write safetensors: %w", err)
	}
	sw := &SafetensorsWriter{path: path, tmp: tmp, w: bufio.NewWriterSize(tmp, 1<<20), specs: own, buf: make([]byte, 4*writeChunk)}
	// CreateTemp makes the file 0600; the result is a file users share.
	if err := tmp.Chmod(0o644); err != nil {
		sw.Abort()
		return nil, err
	}
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(hdr)))
	sw.w.Write(lenBuf[:])
	sw.w.Write(hdr)
	return sw, nil
}

// nextSpec returns the spec of the next tensor, which must be name.
func (sw *SafetensorsWriter) nextSpec(name string) (TensorSpec, error) {
	if sw.next >= len(sw.specs) || sw.specs[sw.next].Name != name {
		want := "none"
		if sw.next < len(sw.specs) {
			want = sw.specs[sw.next].Name
		}
		return TensorSpec{}, fmt.Errorf("write %s: tensor %q out of order (next: %s)", sw.path, name, want)
	}
	return sw.specs[sw.next], nil
}

// WriteRaw appends the data of the next tensor, which must be name, as
// stored: little-endian elements of its dtype, written as they are.
func (sw *SafetensorsWriter) WriteRaw(name string, data []byte) error {
	t, err := sw.nextSpec(name)
	if err != nil {
		return err
	}
	if n := numElements(t.Shape) * int64(DTypeSize(t.DType)); n != int64(len(data)) {
		return fmt.Errorf("write %s: tensor %q: shape %v of %s has %d bytes, data has %d", sw.path, name, t.Shape, t.DType, n, len(data))
	}
	if _, err := sw.w.Write(data); err != nil {
		return fmt.Errorf("write %s: tensor %q: %w", sw.path, name, err)
	}
	sw.next++
	return nil
}

// Write appends the data of the next tensor, which must be name, converted
// to its dtype (bf16 and f16 with round-to-nearest-even).
func (sw *SafetensorsWriter) Write(name string, data []float32) error {
	t, err := sw.nextSpec(name)
	if err != nil {
		return err
	}
	if n := numElements(t.Shape); n != int64(len(data)) {
		return fmt.Errorf("write %s: tensor %q: shape %v has %d elements, data has %d", sw.path, name, t.Shape, n, len(data))
	}
	size := DTypeSize(t.DType)
	for lo := 0; lo < len(data); lo += writeChunk {
		part := data[lo:min(lo+writeChunk, len(data))]
		buf := sw.buf[:len(part)*size]
		encodeParallel(buf, part, t.DType)
		if _, err := sw.w.Write(buf); err != nil {
			return fmt.Errorf("write %s: tensor %q: %w", sw.path, name, err)
		}
	}
	sw.next++
	return nil
}

// Close checks that every tensor was written, syncs the file and renames
// it into place.
func (sw *SafetensorsWriter) Close() (err error) {
	defer func() {
		if err != nil {
			sw.Abort()
		}
	}()
	if sw.next != len(sw.specs) {
		return fmt.Errorf("write %s: %d of %d tensors written", sw.path, sw.next, len(sw.specs))
	}
	if err := sw.w.Flush(); err != nil {
		return fmt.Errorf("write %s: %w", sw.path, err)
	}
	if err := sw.tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", sw.path, err)
	}
	if err := sw.tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", sw.path, err)
	}
	if err := os.Rename(sw.tmp.Name(), sw.path); err != nil {
		return fmt.Errorf("write safetensors: %w", err)
	}
	return nil
}

// Abort removes the temporary file; the path is left as it was.
func (sw *SafetensorsWriter) Abort() {
	sw.tmp.Close()
	os.Remove(sw.tmp.Name())
}

// encodeParallel encodes src into dst in dtype dt (BF16, F16 or F32,
// little-endian), splitting large inputs over the CPUs.
func encodeParallel(dst []byte, src []float32, dt string) {
	const piece = 1 << 18
	if len(src) <= piece {
		encode(dst, src, dt)
		return
	}
	size := DTypeSize(dt)
	var wg sync.WaitGroup
	for lo := 0; lo < len(src); lo += piece {
		hi := min(lo+piece, len(src))
		wg.Go(func() { encode(dst[lo*size:hi*size], src[lo:hi], dt) })
	}
	wg.Wait()
}

// encode encodes src into dst in dtype dt, rounding to nearest even.
func encode(dst []byte, src []float32, dt string) {
	switch dt {
	case BF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], float32ToBF16(v))
		}
	case F16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], float32ToF16(v))
		}
	default:
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	}
}
