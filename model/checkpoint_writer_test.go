package model

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
)

// TestCheckpointWriter writes the same tensors under several maximum shard
// sizes and checks the files (their names and the tensors in each), the
// index, and the values read back through OpenCheckpoint.
func TestCheckpointWriter(t *testing.T) {
	// Bytes: a 24, b 8, big 64, c 16, d 4; 116 in all.
	specs := []TensorSpec{
		{Name: "a", DType: F32, Shape: []int64{2, 3}},
		{Name: "b", DType: BF16, Shape: []int64{4}},
		{Name: "big", DType: F32, Shape: []int64{4, 4}},
		{Name: "c", DType: F16, Shape: []int64{2, 4}},
		{Name: "d", DType: F32, Shape: []int64{1}},
	}
	tests := []struct {
		max    int64
		shards [][]string // the tensors of each file, in order
	}{
		{0, [][]string{{"a", "b", "big", "c", "d"}}},   // the default, 5 GB
		{116, [][]string{{"a", "b", "big", "c", "d"}}}, // exactly the total: one file
		{115, [][]string{{"a", "b", "big", "c"}, {"d"}}},
		{32, [][]string{{"a", "b"}, {"big"}, {"c", "d"}}}, // big (64) is alone
		{24, [][]string{{"a"}, {"b"}, {"big"}, {"c", "d"}}},
		{1, [][]string{{"a"}, {"b"}, {"big"}, {"c"}, {"d"}}}, // every tensor above the limit
	}
	values := map[string][]float32{}
	for i, s := range specs {
		v := make([]float32, numElements(s.Shape))
		for k := range v {
			v[k] = float32(i) + float32(k)/4 // exact in bf16 and f16
		}
		values[s.Name] = v
	}
	for _, tc := range tests {
		dir := t.TempDir()
		w, err := NewCheckpointWriter(dir, specs, tc.max)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range specs {
			if err := w.Write(s.Name, values[s.Name]); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		n := len(tc.shards)
		var want []string
		for i := range tc.shards {
			if n == 1 {
				want = append(want, SingleFileName)
			} else {
				want = append(want, ShardFileName(i+1, n))
			}
		}
		if n > 1 {
			want = append(want, IndexFileName)
		}
		if got := w.Files(); !slices.Equal(got, want) {
			t.Errorf("max %d: files %v, want %v", tc.max, got, want)
		}
		entries, _ := os.ReadDir(dir)
		var onDisk []string
		for _, e := range entries {
			onDisk = append(onDisk, e.Name())
		}
		if slices.Sort(want); !slices.Equal(onDisk, want) {
			t.Errorf("max %d: the directory holds %v, want %v", tc.max, onDisk, want)
		}
		for i, names := range tc.shards {
			file := SingleFileName
			if n > 1 {
				file = ShardFileName(i+1, n)
			}
			f, err := ReadHeader(filepath.Join(dir, file))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, x := range f.Tensors {
				got = append(got, x.Name)
			}
			slices.Sort(got)
			if !slices.Equal(got, names) {
				t.Errorf("max %d: %s holds %v, want %v", tc.max, file, got, names)
			}
		}
		if n > 1 {
			data, err := os.ReadFile(filepath.Join(dir, IndexFileName))
			if err != nil {
				t.Fatal(err)
			}
			var idx map[string]any
			if err := json.Unmarshal(data, &idx); err != nil {
				t.Fatal(err)
			}
			wm := map[string]any{}
			for i, names := range tc.shards {
				for _, name := range names {
					wm[name] = ShardFileName(i+1, n)
				}
			}
			want := map[string]any{"metadata": map[string]any{"total_size": 116.0}, "weight_map": wm}
			if !reflect.DeepEqual(idx, want) {
				t.Errorf("max %d: index %s, want %v", tc.max, data, want)
			}
		}
		ck, err := OpenCheckpoint(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range specs {
			info, _, _ := ck.Tensor(s.Name)
			got := make([]float32, len(values[s.Name]))
			if err := ck.ReadRows(s.Name, 0, info.Shape[0], got); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, values[s.Name]) {
				t.Errorf("max %d: %s reads back as %v, want %v", tc.max, s.Name, got, values[s.Name])
			}
		}
		ck.Close()
	}
}

// TestCheckpointWriterReplaces writes a sharded checkpoint over a single
// file and back: the other layout's weight files go, other files stay.
func TestCheckpointWriterReplaces(t *testing.T) {
	dir := t.TempDir()
	specs := []TensorSpec{{Name: "x", DType: F32, Shape: []int64{4}}, {Name: "y", DType: F32, Shape: []int64{4}}}
	write := func(max int64) {
		t.Helper()
		w, err := NewCheckpointWriter(dir, specs, max)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range specs {
			if err := w.Write(s.Name, make([]float32, 4)); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	keep := []string{"README.md", "model-extra.safetensors"}
	for _, f := range append(keep, ShardFileName(1, 3), ShardFileName(3, 3)) {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		max  int64
		want []string
	}{
		{0, []string{SingleFileName}},
		{16, []string{ShardFileName(1, 2), ShardFileName(2, 2), IndexFileName}},
		{0, []string{SingleFileName}},
	} {
		write(c.max)
		entries, _ := os.ReadDir(dir)
		var got []string
		for _, e := range entries {
			got = append(got, e.Name())
		}
		want := append(slices.Clone(keep), c.want...)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("max %d: the directory holds %v, want %v", c.max, got, want)
		}
	}
}

// TestCheckpointWriterErrors: tensors out of order, closing early, and
// a bad dtype fail, and leave no temporary file.
func TestCheckpointWriterErrors(t *testing.T) {
	dir := t.TempDir()
	specs := []TensorSpec{{Name: "x", DType: F32, Shape: []int64{2}}, {Name: "y", DType: F32, Shape: []int64{2}}}
	if _, err := NewCheckpointWriter(dir, []TensorSpec{{Name: "i", DType: "I64", Shape: []int64{1}}}, 0); err == nil {
		t.Error("an I64 tensor is no error")
	}
	if _, err := NewCheckpointWriter(dir, append(specs, specs[0]), 8); err == nil {
		t.Error("a duplicate tensor is no error")
	}
	w, err := NewCheckpointWriter(dir, specs, 8)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write("y", []float32{1, 2}); err == nil {
		t.Error("writing y first is no error")
	}
	if err := w.Write("x", []float32{1, 2}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err == nil {
		t.Error("closing with y unwritten is no error")
	}
	if _, err := os.Stat(filepath.Join(dir, IndexFileName)); !os.IsNotExist(err) {
		t.Errorf("a failed checkpoint has an index: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*.tmp*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
