package model

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

func loadTiny(t *testing.T, family string) *Config {
	t.Helper()
	c, err := LoadConfig("testdata/tiny-" + family + ".json")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestWriteCheckpointRoundTrip(t *testing.T) {
	for _, fam := range []string{"llama", "qwen2", "qwen3", "mistral", "llama-bias"} {
		t.Run(fam, func(t *testing.T) {
			c := loadTiny(t, fam)
			dir := filepath.Join(t.TempDir(), "ckpt")
			ts := RandomTensors(c, 1, 0.02)
			if err := WriteCheckpoint(dir, c, ts); err != nil {
				t.Fatal(err)
			}
			back, err := LoadConfig(dir)
			if err != nil {
				t.Fatal(err)
			}
			equalConfig(t, back, stripped(c))
			ck, err := OpenCheckpoint(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			if err := ck.Check(back); err != nil {
				t.Fatal(err)
			}
			if len(ck.Names()) != len(ts) {
				t.Errorf("%d tensors, wrote %d", len(ck.Names()), len(ts))
			}
			// Every tensor reads back as written, up to the dtype's rounding.
			for _, tensor := range ts {
				info, _, ok := ck.Tensor(tensor.Name)
				if !ok {
					t.Fatalf("tensor %s missing", tensor.Name)
				}
				got := make([]float32, len(tensor.Data))
				if err := ck.ReadRows(tensor.Name, 0, info.Shape[0], got); err != nil {
					t.Fatal(err)
				}
				for i, v := range tensor.Data {
					if want := roundTo(info.DType, v); got[i] != want {
						t.Fatalf("%s[%d] = %v, want %v", tensor.Name, i, got[i], want)
					}
				}
			}
		})
	}
}

func roundTo(dtype string, v float32) float32 {
	switch dtype {
	case BF16:
		return bf16ToFloat32(float32ToBF16(v))
	case F16:
		return f16ToFloat32(float32ToF16(v))
	}
	return v
}

func TestRandomTensors(t *testing.T) {
	c := loadTiny(t, "qwen2")
	a, b, other := RandomTensors(c, 7, 0.02), RandomTensors(c, 7, 0.02), RandomTensors(c, 8, 0.02)
	var n int64
	for i := range a {
		if a[i].Name != b[i].Name || !slices.Equal(a[i].Data, b[i].Data) {
			t.Fatalf("tensor %s differs between runs with the same seed", a[i].Name)
		}
		if a[i].DType != F32 {
			t.Errorf("%s dtype %s, want F32 from the config", a[i].Name, a[i].DType)
		}
		n += int64(len(a[i].Data))
		switch {
		case strings.HasSuffix(a[i].Name, "norm.weight"):
			for _, v := range a[i].Data {
				if v != 1 {
					t.Fatalf("%s has %v, want 1", a[i].Name, v)
				}
			}
		case strings.HasSuffix(a[i].Name, "embed_tokens.weight"):
			if slices.Equal(a[i].Data, other[i].Data) {
				t.Error("different seeds give the same embedding")
			}
		}
	}
	if n != c.NumParams() {
		t.Errorf("%d elements, config has %d parameters", n, c.NumParams())
	}
}

// writeCkpt writes config.json for c and tensors as model.safetensors
// without WriteCheckpoint's validation, so tests can plant mistakes.
func writeCkpt(t *testing.T, c *Config, ts []Tensor) string {
	t.Helper()
	dir := t.TempDir()
	cfg, err := c.MarshalHF()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ConfigFileName), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteSafetensors(filepath.Join(dir, SingleFileName), ts); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestCheck(t *testing.T) {
	const layer0 = "model.layers.0."
	tests := []struct {
		family string
		name   string
		edit   func([]Tensor) []Tensor
		want   []string // substrings, each a separate problem
		is     []error
	}{
		{"llama", "ok", nil, nil, nil},
		{"llama", "missing tensor", func(ts []Tensor) []Tensor {
			return slices.DeleteFunc(ts, func(x Tensor) bool { return x.Name == layer0+"mlp.up_proj.weight" })
		}, []string{`: missing tensor "model.layers.0.mlp.up_proj.weight"`}, []error{ErrMissingTensor}},
		{"llama", "missing lm_head untied", func(ts []Tensor) []Tensor {
			return slices.DeleteFunc(ts, func(x Tensor) bool { return x.Name == "lm_head.weight" })
		}, []string{`missing tensor "lm_head.weight"`}, []error{ErrMissingTensor}},
		{"llama", "wrong shape", func(ts []Tensor) []Tensor {
			for i := range ts {
				if ts[i].Name == layer0+"self_attn.k_proj.weight" {
					ts[i].Shape = []int64{64, 16}
					ts[i].Data = ts[i].Data[:64*16]
				}
			}
			return ts
		}, []string{`model.safetensors: tensor "model.layers.0.self_attn.k_proj.weight": shape mismatch: got [64 16], want [32 64]`},
			[]error{ErrShapeMismatch}},
		{"llama", "unknown tensor", func(ts []Tensor) []Tensor {
			return append(ts, Tensor{Name: "model.layers.0.mlp.extra.weight", DType: "F32", Shape: []int64{1}, Data: []float32{0}})
		}, []string{`model.safetensors: unexpected tensor "model.layers.0.mlp.extra.weight": not a parameter of llama`},
			[]error{ErrUnexpectedTensor}},
		{"llama", "inv_freq ignored", func(ts []Tensor) []Tensor {
			return append(ts, Tensor{Name: "model.layers.1.self_attn.rotary_emb.inv_freq", DType: "F32", Shape: []int64{8}, Data: make([]float32, 8)})
		}, nil, nil},
		{"qwen2", "tied lm_head allowed", func(ts []Tensor) []Tensor {
			return append(ts, Tensor{Name: "lm_head.weight", DType: "F32", Shape: []int64{256, 64}, Data: make([]float32, 256*64)})
		}, nil, nil},
		{"qwen2", "missing bias", func(ts []Tensor) []Tensor {
			return slices.DeleteFunc(ts, func(x Tensor) bool { return strings.HasSuffix(x.Name, "v_proj.bias") })
		}, []string{`missing tensor "model.layers.0.self_attn.v_proj.bias"`, `missing tensor "model.layers.1.self_attn.v_proj.bias"`},
			[]error{ErrMissingTensor}},
		{"llama-bias", "ok", nil, nil, nil},
		{"llama-bias", "missing o_proj bias", func(ts []Tensor) []Tensor {
			return slices.DeleteFunc(ts, func(x Tensor) bool { return strings.HasSuffix(x.Name, "o_proj.bias") })
		}, []string{`missing tensor "model.layers.0.self_attn.o_proj.bias"`, `missing tensor "model.layers.1.self_attn.o_proj.bias"`},
			[]error{ErrMissingTensor}},
		{"llama-bias", "o_proj bias shape", func(ts []Tensor) []Tensor {
			for i := range ts {
				if ts[i].Name == layer0+"self_attn.o_proj.bias" {
					ts[i].Shape = []int64{32}
					ts[i].Data = ts[i].Data[:32]
				}
			}
			return ts
		}, []string{`tensor "model.layers.0.self_attn.o_proj.bias": shape mismatch: got [32], want [64]`}, []error{ErrShapeMismatch}},
		{"llama", "o_proj bias without attention_bias", func(ts []Tensor) []Tensor {
			return append(ts, Tensor{Name: layer0 + "self_attn.o_proj.bias", DType: "F32", Shape: []int64{64}, Data: make([]float32, 64)})
		}, []string{`unexpected tensor "model.layers.0.self_attn.o_proj.bias": not a parameter of llama`}, []error{ErrUnexpectedTensor}},
		// Qwen2 has q/k/v biases but never an o_proj bias.
		{"qwen2", "o_proj bias", func(ts []Tensor) []Tensor {
			return append(ts, Tensor{Name: layer0 + "self_attn.o_proj.bias", DType: "F32", Shape: []int64{64}, Data: make([]float32, 64)})
		}, []string{`unexpected tensor "model.layers.0.self_attn.o_proj.bias": not a parameter of qwen2`}, []error{ErrUnexpectedTensor}},
		{"qwen3", "several problems at once", func(ts []Tensor) []Tensor {
			ts = slices.DeleteFunc(ts, func(x Tensor) bool { return x.Name == "model.layers.2.self_attn.q_norm.weight" })
			for i := range ts {
				if ts[i].Name == "model.embed_tokens.weight" {
					ts[i].Shape = []int64{64, 300}
				}
			}
			return ts
		}, []string{`tensor "model.embed_tokens.weight": shape mismatch: got [64 300], want [300 64]`,
			`missing tensor "model.layers.2.self_attn.q_norm.weight"`}, []error{ErrMissingTensor, ErrShapeMismatch}},
	}
	for _, tt := range tests {
		t.Run(tt.family+"/"+tt.name, func(t *testing.T) {
			c := loadTiny(t, tt.family)
			ts := RandomTensors(c, 3, 0.02)
			if tt.edit != nil {
				ts = tt.edit(ts)
			}
			dir := writeCkpt(t, c, ts)
			ck, err := OpenCheckpoint(dir)
			if err != nil {
				t.Fatal(err)
			}
			err = ck.Check(c)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) {
				t.Errorf("%d problems, want %d:\n%v", len(lines), len(tt.want), err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n%v\ndoes not mention %q", err, w)
				}
			}
			for _, e := range tt.is {
				if !errors.Is(err, e) {
					t.Errorf("error does not wrap %v", e)
				}
			}
			// WriteCheckpoint refuses the same tensors.
			if err := WriteCheckpoint(filepath.Join(t.TempDir(), "w"), c, ts); err == nil {
				t.Error("WriteCheckpoint accepted tensors that Check rejects")
			}
		})
	}
}

// TestCheckUnsupportedDType plants an F64 tensor, which WriteSafetensors
// cannot produce, in a second shard.
func TestCheckUnsupportedDType(t *testing.T) {
	c := loadTiny(t, "llama")
	ts := slices.DeleteFunc(RandomTensors(c, 3, 0.02), func(x Tensor) bool { return x.Name == "model.norm.weight" })
	dir := writeCkpt(t, c, ts)
	// Move the tensors into a shard and add a second shard with an F64 norm.
	if err := os.Rename(filepath.Join(dir, SingleFileName), filepath.Join(dir, "a.safetensors")); err != nil {
		t.Fatal(err)
	}
	hdr := `{"model.norm.weight":{"dtype":"F64","shape":[64],"data_offsets":[0,512]}}`
	b := rawFile(t, uint64(len(hdr)), hdr, make([]byte, 512))
	data, _ := os.ReadFile(b)
	os.WriteFile(filepath.Join(dir, "b.safetensors"), data, 0o644)
	wm := map[string]string{"model.norm.weight": "b.safetensors"}
	for _, x := range ts {
		wm[x.Name] = "a.safetensors"
	}
	writeIndex(t, dir, wm)
	ck, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	err = ck.Check(c)
	want := filepath.Join(dir, "b.safetensors") + `: tensor "model.norm.weight": unsupported dtype F64 (supported: BF16, F16, F32)`
	if err == nil || err.Error() != want {
		t.Fatalf("error %v, want %s", err, want)
	}
	if !errors.Is(err, ErrUnsupported) {
		t.Error("error does not wrap ErrUnsupported")
	}
	if err := ck.ReadRows("model.norm.weight", 0, 1, make([]float32, 1)); !errors.Is(err, ErrUnsupported) {
		t.Errorf("ReadRows of F64: %v", err)
	}
}

func writeIndex(t *testing.T, dir string, weightMap map[string]string) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": weightMap})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, IndexFileName), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// shardedCkpt writes the tensors of c in two shards split by layer.
func shardedCkpt(t *testing.T, c *Config) (string, []Tensor, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	ts := RandomTensors(c, 5, 0.02)
	shards := map[string][]Tensor{}
	wm := map[string]string{}
	for _, x := range ts {
		s := "model-00001-of-00002.safetensors"
		if strings.HasPrefix(x.Name, "model.layers.1.") || x.Name == "model.norm.weight" || x.Name == "lm_head.weight" {
			s = "model-00002-of-00002.safetensors"
		}
		shards[s] = append(shards[s], x)
		wm[x.Name] = s
	}
	for s, xs := range shards {
		if err := WriteSafetensors(filepath.Join(dir, s), xs); err != nil {
			t.Fatal(err)
		}
	}
	cfg, _ := c.MarshalHF()
	os.WriteFile(filepath.Join(dir, ConfigFileName), cfg, 0o644)
	return dir, ts, wm
}

func TestShardedCheckpoint(t *testing.T) {
	c := loadTiny(t, "llama")
	dir, ts, wm := shardedCkpt(t, c)
	writeIndex(t, dir, wm)
	ck, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if len(ck.Files) != 2 || ck.Index == "" {
		t.Fatalf("%d files, index %q", len(ck.Files), ck.Index)
	}
	if err := ck.Check(c); err != nil {
		t.Fatal(err)
	}
	_, f, _ := ck.Tensor("lm_head.weight")
	if filepath.Base(f.Path) != "model-00002-of-00002.safetensors" {
		t.Errorf("lm_head in %s", f.Path)
	}
	// Read a slice of a tensor in the second shard.
	for _, x := range ts {
		if x.Name != "lm_head.weight" {
			continue
		}
		got := make([]float32, 3*64)
		if err := ck.ReadRows(x.Name, 10, 13, got); err != nil {
			t.Fatal(err)
		}
		for i, v := range got {
			if want := roundTo(BF16, x.Data[10*64+i]); v != want {
				t.Fatalf("lm_head row data [%d] = %v, want %v", i, v, want)
			}
		}
	}
}

func TestShardedCheckpointErrors(t *testing.T) {
	const s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
	tests := []struct {
		name string
		edit func(dir string, wm map[string]string)
		want []string
		is   error
	}{
		{"index names a tensor missing from its shard", func(dir string, wm map[string]string) {
			wm["model.layers.0.mlp.ghost.weight"] = s1
		}, []string{s1 + `: missing tensor "model.layers.0.mlp.ghost.weight" listed for it in model.safetensors.index.json`}, ErrMissingTensor},
		{"tensor mapped to the wrong shard", func(dir string, wm map[string]string) {
			wm["model.norm.weight"] = s1
		}, []string{s1 + `: missing tensor "model.norm.weight"`,
			s2 + `: unexpected tensor "model.norm.weight" is not mapped to this shard`}, ErrMissingTensor},
		{"missing shard file", func(dir string, wm map[string]string) {
			os.Remove(filepath.Join(dir, s2))
		}, []string{"open safetensors"}, os.ErrNotExist},
		{"shard path escapes the directory", func(dir string, wm map[string]string) {
			wm["model.norm.weight"] = "../x.safetensors"
		}, []string{`shard name "../x.safetensors" is not a plain file name`}, ErrInvalidSafetensors},
		{"corrupt shard", func(dir string, wm map[string]string) {
			os.WriteFile(filepath.Join(dir, s2), []byte("garbage!garbage!"), 0o644)
		}, []string{s2 + ": invalid safetensors file"}, ErrInvalidSafetensors},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := loadTiny(t, "llama")
			dir, _, wm := shardedCkpt(t, c)
			tt.edit(dir, wm)
			writeIndex(t, dir, wm)
			_, err := OpenCheckpoint(dir)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n%v\ndoes not mention %q", err, w)
				}
			}
			if !errors.Is(err, tt.is) {
				t.Errorf("error does not wrap %v", tt.is)
			}
		})
	}
}

func TestOpenCheckpointErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := OpenCheckpoint(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("empty dir: %v", err)
	}
	os.WriteFile(filepath.Join(dir, IndexFileName), []byte(`{"metadata": {}}`), 0o644)
	if _, err := OpenCheckpoint(dir); !errors.Is(err, ErrInvalidSafetensors) || !strings.Contains(err.Error(), "weight_map is missing or empty") {
		t.Errorf("index without weight_map: %v", err)
	}
	os.WriteFile(filepath.Join(dir, IndexFileName), []byte(`{"weight_map": [`), 0o644)
	if _, err := OpenCheckpoint(dir); !errors.Is(err, ErrInvalidSafetensors) {
		t.Errorf("garbage index: %v", err)
	}
}

func TestReadRows(t *testing.T) {
	// Small pieces, so that raw reads of m are split over several readers.
	defer func(p int) { rawPiece = p }(rawPiece)
	rawPiece = 64 << 10
	// Values exactly representable in bf16 and f16 read back exactly.
	const rows, cols = 1100, 300 // over 1 MiB as F32, to cross read chunks
	data := make([]float32, rows*cols)
	for i := range data {
		data[i] = float32(i%509-254) / 8
	}
	scalar := []float32{3.5}
	for _, dt := range []string{"bf16", "fp16", "F32"} {
		t.Run(dt, func(t *testing.T) {
			dir := t.TempDir()
			err := WriteSafetensors(filepath.Join(dir, SingleFileName), []Tensor{
				{Name: "m", DType: dt, Shape: []int64{rows, cols}, Data: data},
				{Name: "v", DType: dt, Shape: []int64{5}, Data: data[:5]},
				{Name: "s", DType: dt, Shape: []int64{}, Data: scalar},
				{Name: "e", DType: dt, Shape: []int64{0, 4}, Data: nil},
			})
			if err != nil {
				t.Fatal(err)
			}
			ck, err := OpenCheckpoint(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			ranges := []struct {
				name         string
				r0, r1, cols int64
			}{
				{"m", 0, rows, cols}, {"m", 1, 3, cols}, {"m", rows - 1, rows, cols}, {"m", 7, 7, cols},
				{"m", 3, 1000, cols}, {"v", 2, 5, 1}, {"s", 0, 1, 1}, {"e", 0, 0, 4},
			}
			var wg sync.WaitGroup
			for _, r := range ranges {
				wg.Add(1)
				go func() { // concurrent readers, as ranks in one process
					defer wg.Done()
					dst := make([]float32, (r.r1-r.r0)*r.cols)
					if err := ck.ReadRows(r.name, r.r0, r.r1, dst); err != nil {
						t.Error(err)
						return
					}
					src := data
					if r.name == "s" {
						src = scalar
					}
					want := src[r.r0*r.cols : r.r1*r.cols]
					if !slices.Equal(dst, want) {
						t.Errorf("%s rows [%d,%d) differ", r.name, r.r0, r.r1)
					}
					// The same rows as stored, decoded here.
					sdt, err := ck.StoredDType(r.name)
					if err != nil {
						t.Error(err)
						return
					}
					raw := make([]byte, len(dst)*sdt.Size())
					if err := ck.ReadRowsRaw(r.name, r.r0, r.r1, raw); err != nil {
						t.Error(err)
						return
					}
					for i, w := range want {
						var got float32
						switch sdt {
						case gpu.BF16:
							got = bf16ToFloat32(binary.LittleEndian.Uint16(raw[2*i:]))
						case gpu.F16:
							got = f16ToFloat32(binary.LittleEndian.Uint16(raw[2*i:]))
						default:
							got = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
						}
						if got != w {
							t.Errorf("%s rows [%d,%d): raw element %d = %v, want %v", r.name, r.r0, r.r1, i, got, w)
							return
						}
					}
				}()
			}
			wg.Wait()
			if err := ck.ReadRowsRaw("m", 0, 2, make([]byte, 3)); err == nil || !strings.Contains(err.Error(), "dst has 3 bytes") {
				t.Errorf("short raw dst: %v", err)
			}
			if err := ck.ReadRowsRaw("nope", 0, 1, nil); !errors.Is(err, ErrMissingTensor) {
				t.Errorf("missing tensor: %v", err)
			}
		})
	}
}

func TestReadRowsRounding(t *testing.T) {
	dir := t.TempDir()
	vals := []float32{0.1, -1.0 / 3, 1e-8, 70000, 1 + 1.0/256}
	var ts []Tensor
	for _, dt := range []string{BF16, F16, F32} {
		ts = append(ts, Tensor{Name: dt, DType: dt, Shape: []int64{int64(len(vals))}, Data: vals})
	}
	if err := WriteSafetensors(filepath.Join(dir, SingleFileName), ts); err != nil {
		t.Fatal(err)
	}
	ck, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	for _, dt := range []string{BF16, F16, F32} {
		got := make([]float32, len(vals))
		if err := ck.ReadRows(dt, 0, int64(len(vals)), got); err != nil {
			t.Fatal(err)
		}
		for i, v := range vals {
			if want := roundTo(dt, v); got[i] != want {
				t.Errorf("%s: %v read back as %v, want %v", dt, v, got[i], want)
			}
		}
	}
}

func TestReadRowsErrors(t *testing.T) {
	dir := t.TempDir()
	err := WriteSafetensors(filepath.Join(dir, SingleFileName), []Tensor{
		{Name: "m", DType: "F32", Shape: []int64{4, 2}, Data: make([]float32, 8)},
	})
	if err != nil {
		t.Fatal(err)
	}
	ck, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	tests := []struct {
		name   string
		tensor string
		r0, r1 int64
		n      int
		want   string
	}{
		{"unknown tensor", "x", 0, 1, 2, `missing tensor "x"`},
		{"past the end", "m", 2, 5, 6, "rows [2, 5) out of range [0, 4)"},
		{"negative", "m", -1, 1, 4, "rows [-1, 1) out of range [0, 4)"},
		{"reversed", "m", 3, 2, 0, "rows [3, 2) out of range [0, 4)"},
		{"dst too small", "m", 0, 2, 3, "dst has 3 elements, rows [0, 2) need 4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ck.ReadRows(tt.tensor, tt.r0, tt.r1, make([]float32, tt.n))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want %q", err, tt.want)
			}
		})
	}
	// Reads work again after Close.
	ck.Close()
	if err := ck.ReadRows("m", 0, 1, make([]float32, 2)); err != nil {
		t.Errorf("ReadRows after Close: %v", err)
	}
}

func ExampleConfig_NumParams() {
	c, err := LoadConfig("../examples/models/qwen2.5-0.5b")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(c.Family, c.NumParams(), len(c.Units()))
	// Output: qwen2 494032768 26
}

// TestHFCheckpoints opens the tiny checkpoints written by transformers'
// save_pretrained (transformers 5 dialect) under testdata/hf, when present.
func TestHFCheckpoints(t *testing.T) {
	// Golden cases that are not named after their model_type.
	modelType := map[string]string{"llama_bias": "llama"}
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			want := fam
			if mt, ok := modelType[fam]; ok {
				want = mt
			}
			dir := filepath.Join("testdata", "hf", fam, "model")
			if _, err := os.Stat(dir); err != nil {
				t.Skip("no HF checkpoint:", err)
			}
			c, err := LoadConfig(dir)
			if err != nil {
				t.Fatal(err)
			}
			if string(c.Family) != want || c.DType != "float32" || c.RopeTheta != 10000 {
				t.Errorf("config %+v", *c)
			}
			ck, err := OpenCheckpoint(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			if err := ck.Check(c); err != nil {
				t.Fatal(err)
			}
			norm := make([]float32, c.HiddenSize)
			if err := ck.ReadRows("model.norm.weight", 0, int64(c.HiddenSize), norm); err != nil {
				t.Fatal(err)
			}
			var ones int
			for _, v := range norm {
				if v == 1 {
					ones++
				}
			}
			if ones == len(norm) {
				t.Error("model.norm.weight is all ones; expected randomised norms")
			}
			// Only llama_bias has o_proj biases; like every bias they are
			// randomised, so a model that skipped one would fail parity.
			if c.OutputBias != (fam == "llama_bias") {
				t.Errorf("OutputBias = %v", c.OutputBias)
			}
			nb := 0
			for _, name := range ck.Names() {
				if !strings.HasSuffix(name, ".bias") {
					continue
				}
				info, _, _ := ck.Tensor(name)
				b := make([]float32, info.Shape[0])
				if err := ck.ReadRows(name, 0, info.Shape[0], b); err != nil {
					t.Fatal(err)
				}
				if !slices.ContainsFunc(b, func(v float32) bool { return v != 0 }) {
					t.Errorf("%s is all zeros; expected a randomised bias", name)
				}
				nb++
			}
			if want := c.NumLayers * (3*btoi(c.AttentionBias) + btoi(c.OutputBias)); nb != want {
				t.Errorf("%d bias tensors, want %d", nb, want)
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
