package model

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// rawFile writes a safetensors file with the given header length prefix,
// header text and data bytes.
func rawFile(t *testing.T, hlen uint64, header string, data []byte) string {
	t.Helper()
	var b []byte
	b = binary.LittleEndian.AppendUint64(b, hlen)
	b = append(b, header...)
	b = append(b, data...)
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// goodFile writes a well-formed file from header text and n data bytes.
func goodFile(t *testing.T, header string, n int) string {
	return rawFile(t, uint64(len(header)), header, make([]byte, n))
}

func TestReadHeader(t *testing.T) {
	hdr := `{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[16,28]},` +
		`"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"s":{"dtype":"I64","shape":[],"data_offsets":[28,36]},` +
		`"z":{"dtype":"F8_E4M3","shape":[0],"data_offsets":[36,36]}}   `
	f, err := ReadHeader(goodFile(t, hdr, 36))
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["format"] != "pt" || f.HeaderLen != int64(len(hdr)) || f.DataStart() != 8+int64(len(hdr)) {
		t.Errorf("metadata %v header %d", f.Metadata, f.HeaderLen)
	}
	var names []string
	for _, ti := range f.Tensors {
		names = append(names, ti.Name)
	}
	if strings.Join(names, ",") != "a,b,s,z" {
		t.Errorf("tensors %v not sorted by name", names)
	}
	b, ok := f.Tensor("b")
	if !ok || b.DType != BF16 || b.Begin != 16 || b.End != 28 || b.NumElements() != 6 {
		t.Errorf("tensor b = %+v", b)
	}
	if s, _ := f.Tensor("s"); s.NumElements() != 1 || len(s.Shape) != 0 {
		t.Errorf("scalar tensor = %+v", s)
	}
}

func TestReadHeaderErrors(t *testing.T) {
	one := `{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}`
	tests := []struct {
		name string
		path func(t *testing.T) string
		want string
	}{
		{"shorter than length prefix", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "x.safetensors")
			os.WriteFile(p, []byte{1, 2, 3}, 0o644)
			return p
		}, "file is 3 bytes, shorter than the 8-byte header length"},
		{"header length past end of file", func(t *testing.T) string {
			return rawFile(t, 1000, one, make([]byte, 16))
		}, "header length 1000 exceeds the"},
		{"absurd header length", func(t *testing.T) string {
			return rawFile(t, 1<<62, one, nil)
		}, "exceeds the 104857600-byte limit"},
		{"JSON garbage", func(t *testing.T) string {
			return goodFile(t, `{"w": {"dtype": "F32", "sha`, 0)
		}, "header JSON"},
		{"not an object", func(t *testing.T) string { return goodFile(t, `[1, 2]`, 0) }, "header is not a JSON object"},
		{"empty header", func(t *testing.T) string { return goodFile(t, ``, 0) }, "header is not a JSON object"},
		{"unknown dtype", func(t *testing.T) string {
			return goodFile(t, `{"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,1]}}`, 1)
		}, `tensor "w": unknown dtype "Q4"`},
		{"missing data_offsets", func(t *testing.T) string {
			return goodFile(t, `{"w":{"dtype":"F32","shape":[2]}}`, 8)
		}, `tensor "w": needs dtype, shape and data_offsets`},
		{"three offsets", func(t *testing.T) string {
			return goodFile(t, `{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}}`, 8)
		}, "data_offsets has 3 entries, want 2"},
		{"negative dimension", func(t *testing.T) string {
			return goodFile(t, `{"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, 8)
		}, "negative dimension"},
		{"overflowing shape", func(t *testing.T) string {
			return goodFile(t, `{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, 8)
		}, "is too large"},
		{"reversed offsets", func(t *testing.T) string {
			return goodFile(t, `{"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}`, 8)
		}, "bad data_offsets [8, 0]"},
		{"shape and offsets disagree", func(t *testing.T) string {
			return goodFile(t, `{"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,16]}}`, 16)
		}, `tensor "w": data_offsets [0, 16] span 16 bytes, but BF16 [2 2] needs 8`},
		{"offsets past end of file", func(t *testing.T) string {
			return goodFile(t, `{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}`, 10)
		}, `tensor "w": data_offsets [0, 16] extend past the end of the data region (10 bytes): file truncated`},
		{"gap", func(t *testing.T) string {
			return goodFile(t, `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, 12)
		}, `tensor "b": gap in data region`},
		{"overlap", func(t *testing.T) string {
			return goodFile(t, `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8)
		}, `tensor "b": data_offsets [4, 8] overlap the previous tensor ending at 8`},
		{"trailing data", func(t *testing.T) string { return goodFile(t, one, 20) }, "4 bytes of data after the last tensor"},
		{"bad metadata", func(t *testing.T) string {
			return goodFile(t, `{"__metadata__":{"n":1}}`, 0)
		}, "__metadata__ must map strings to strings"},
		{"truncated real file", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "model.safetensors")
			err := WriteSafetensors(p, []Tensor{{Name: "w", DType: "bf16", Shape: []int64{4, 4}, Data: make([]float32, 16)}})
			if err != nil {
				t.Fatal(err)
			}
			st, _ := os.Stat(p)
			if err := os.Truncate(p, st.Size()-3); err != nil {
				t.Fatal(err)
			}
			return p
		}, "file truncated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.path(t)
			_, err := ReadHeader(p)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrInvalidSafetensors) {
				t.Errorf("error does not wrap ErrInvalidSafetensors: %v", err)
			}
			if !strings.HasPrefix(err.Error(), p+": ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q\nwant prefix %q and %q", err, p, tt.want)
			}
		})
	}
}

func TestReadHeaderMissingFile(t *testing.T) {
	_, err := ReadHeader(filepath.Join(t.TempDir(), "nope.safetensors"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("got %v", err)
	}
}

func TestWriteSafetensorsDeterministic(t *testing.T) {
	ts := []Tensor{
		{Name: "z", DType: "F32", Shape: []int64{2}, Data: []float32{1, 2}},
		{Name: "a", DType: "bfloat16", Shape: []int64{1, 3}, Data: []float32{1, 2, 3}},
		{Name: "m", DType: "fp16", Shape: nil, Data: []float32{7}},
	}
	dir := t.TempDir()
	p1, p2 := filepath.Join(dir, "1.safetensors"), filepath.Join(dir, "2.safetensors")
	if err := WriteSafetensors(p1, ts); err != nil {
		t.Fatal(err)
	}
	rev := []Tensor{ts[2], ts[1], ts[0]}
	if err := WriteSafetensors(p2, rev); err != nil {
		t.Fatal(err)
	}
	b1, _ := os.ReadFile(p1)
	b2, _ := os.ReadFile(p2)
	if string(b1) != string(b2) {
		t.Error("output depends on input order")
	}
	if hlen := binary.LittleEndian.Uint64(b1); hlen%8 != 0 {
		t.Errorf("header length %d not 8-aligned", hlen)
	}
	f, err := ReadHeader(p1)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := f.Tensor("a")
	m, _ := f.Tensor("m")
	z, _ := f.Tensor("z")
	if a.Begin != 0 || a.DType != BF16 || m.Begin != 6 || m.DType != F16 || len(m.Shape) != 0 || z.Begin != 8 || z.End != 16 {
		t.Errorf("layout a=%+v m=%+v z=%+v", a, m, z)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

func TestWriteSafetensorsErrors(t *testing.T) {
	tests := []struct {
		name string
		ts   []Tensor
		want string
	}{
		{"length mismatch", []Tensor{{Name: "w", DType: "F32", Shape: []int64{2, 2}, Data: make([]float32, 3)}},
			`tensor "w": shape [2 2] has 4 elements, data has 3`},
		{"duplicate", []Tensor{{Name: "w", DType: "F32", Data: []float32{1}}, {Name: "w", DType: "F32", Data: []float32{1}}},
			`duplicate tensor "w"`},
		{"unsupported dtype", []Tensor{{Name: "w", DType: "I8", Data: []float32{1}}}, `unsupported dtype "I8"`},
		{"reserved name", []Tensor{{Name: "__metadata__", DType: "F32", Data: []float32{1}}}, `invalid tensor name "__metadata__"`},
		{"negative dim", []Tensor{{Name: "w", DType: "F32", Shape: []int64{-1}}}, "negative dimension"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "x.safetensors")
			err := WriteSafetensors(p, tt.ts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
			if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
				t.Error("file written despite error")
			}
		})
	}
}

func TestDTypeSize(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{"bf16", 2}, {"bfloat16", 2}, {"BF16", 2}, {"fp16", 2}, {"float16", 2}, {"F16", 2},
		{"fp32", 4}, {"float32", 4}, {"F32", 4}, {"fp64", 8}, {"F64", 8}, {"fp8", 1}, {"F8_E5M2", 1},
		{"I64", 8}, {"int32", 4}, {"bool", 1}, {"F4", 0}, {"nope", 0}, {"", 0},
	}
	for _, tt := range tests {
		if got := DTypeSize(tt.in); got != tt.want {
			t.Errorf("DTypeSize(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

func TestHalfConversions(t *testing.T) {
	// Every non-NaN 16-bit pattern survives widening and narrowing.
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		if f := bf16ToFloat32(h); !math.IsNaN(float64(f)) && float32ToBF16(f) != h {
			t.Fatalf("bf16 %#04x -> %v -> %#04x", h, f, float32ToBF16(f))
		}
		if f := f16ToFloat32(h); !math.IsNaN(float64(f)) && float32ToF16(f) != h {
			t.Fatalf("f16 %#04x -> %v -> %#04x", h, f, float32ToF16(f))
		}
	}
	tests := []struct {
		name string
		in   float32
		bf16 float32
		f16  float32
	}{
		{"tie rounds to even (down)", 1 + 1.0/256, 1, 1 + 1.0/256},
		{"tie rounds to even (up)", 1 + 3.0/256, 1 + 1.0/64, 1 + 3.0/256},
		{"f16 tie down", 1 + 1.0/2048, 1, 1},
		{"f16 tie up", 1 + 3.0/2048, 1, 1 + 2.0/1024},
		{"f16 max", 65504, 65536, 65504},
		{"f16 overflow", 65520, 65536, float32(math.Inf(1))},
		{"f16 smallest subnormal", 1.0 / (1 << 24), 1.0 / (1 << 24), 1.0 / (1 << 24)},
		{"f16 subnormal tie to zero", 1.0 / (1 << 25), 1.0 / (1 << 25), 0},
		{"f16 subnormal above tie", 1.5 / (1 << 25), 1.5 / (1 << 25), 1.0 / (1 << 24)},
		{"negative", -2.5, -2.5, -2.5},
		{"inf", float32(math.Inf(-1)), float32(math.Inf(-1)), float32(math.Inf(-1))},
		{"bf16 overflow", math.MaxFloat32, float32(math.Inf(1)), float32(math.Inf(1))},
	}
	for _, tt := range tests {
		if got := bf16ToFloat32(float32ToBF16(tt.in)); got != tt.bf16 {
			t.Errorf("%s: bf16(%v) = %v, want %v", tt.name, tt.in, got, tt.bf16)
		}
		if got := f16ToFloat32(float32ToF16(tt.in)); got != tt.f16 {
			t.Errorf("%s: f16(%v) = %v, want %v", tt.name, tt.in, got, tt.f16)
		}
	}
	nan := float32(math.NaN())
	if !math.IsNaN(float64(bf16ToFloat32(float32ToBF16(nan)))) || !math.IsNaN(float64(f16ToFloat32(float32ToF16(nan)))) {
		t.Error("NaN not preserved")
	}
	// A NaN whose payload sits only in the low bits must not become infinity.
	lowNaN := math.Float32frombits(0x7f800001)
	if !math.IsNaN(float64(bf16ToFloat32(float32ToBF16(lowNaN)))) {
		t.Error("low-payload NaN became non-NaN in bf16")
	}
}

// FuzzParseHeader checks that no input makes header parsing panic; under
// plain go test it runs the seed corpus only.
func FuzzParseHeader(f *testing.F) {
	for _, h := range []string{
		`{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}`,
		`{"__metadata__":{"a":"b"},"x":{"dtype":"BF16","shape":[],"data_offsets":[0,2]}}`,
		`{"w":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}`,
	} {
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
		f.Add(append(append(b, h...), make([]byte, 16)...))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		parseHeader("fuzz", bytes.NewReader(b), int64(len(b)))
	})
}

// TestSafetensorsWriterStreams writes tensors one at a time in the given
// (unsorted) order and reads them back; writing out of order, a wrong
// length or closing early fail and leave no file.
func TestSafetensorsWriterStreams(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	specs := []TensorSpec{{Name: "z.weight", DType: "bf16", Shape: []int64{2, 2}}, {Name: "a.bias", DType: "F32", Shape: []int64{3}}}
	w, err := NewSafetensorsWriter(path, specs)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write("a.bias", []float32{1, 2, 3}); err == nil {
		t.Error("writing the second tensor first is no error")
	}
	if err := w.Write("z.weight", []float32{1, 2, 3}); err == nil {
		t.Error("a wrong length is no error")
	}
	if err := w.Write("z.weight", []float32{1.5, -2, 0.25, 8}); err != nil {
		t.Fatal(err)
	}
	if err := w.Write("a.bias", []float32{1e-3, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := ReadHeader(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		dtype string
		n     int64
	}{{"z.weight", BF16, 4}, {"a.bias", F32, 3}} {
		info, ok := f.Tensor(c.name)
		if !ok || info.DType != c.dtype || info.NumElements() != c.n {
			t.Errorf("%s: %+v %v; want %s with %d elements", c.name, info, ok, c.dtype, c.n)
		}
	}
	short := filepath.Join(dir, "short.safetensors")
	w, err = NewSafetensorsWriter(short, specs)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err == nil {
		t.Error("closing before every tensor is written is no error")
	}
	if _, err := os.Stat(short); !os.IsNotExist(err) {
		t.Errorf("a failed write left %s: %v", short, err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*.tmp*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
