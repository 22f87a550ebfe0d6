package model

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// checkGolden compares got with the golden file path, or rewrites it under
// -update.
func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file\n got:\n%s\nwant:\n%s", path, got, want)
	}
}

// TestMarshalExport renders configs of both dialects for an export in
// another dtype: the output is the source byte for byte but the dtype's
// value, under the key the source used (or, where it named none, the key of
// its dialect), and parses back to the config.
func TestMarshalExport(t *testing.T) {
	tests := []struct {
		src, dtype string
		golden     string // "": the source itself
		key        string // the key the dtype must be under
	}{
		{"llama-t4.json", "float32", "llama-t4.float32.json", `"torch_dtype": "float32"`},
		{"llama-t4.json", "bfloat16", "", `"torch_dtype": "bfloat16"`},
		{"qwen2-t5.json", "bfloat16", "qwen2-t5.bfloat16.json", `"dtype": "bfloat16"`},
		{"qwen2-t5.json", "float32", "", `"dtype": "float32"`},
		{"qwen2-both.json", "float16", "qwen2-both.float16.json", `"torch_dtype": "float16"`},
		{"qwen2-t4-nodtype.json", "bfloat16", "qwen2-t4-nodtype.bfloat16.json", `"torch_dtype": "bfloat16"`},
		{"qwen2-t4-nodtype.json", "float32", "", ""},
		{"qwen3-t5-compact.json", "float16", "qwen3-t5-compact.float16.json", `"dtype":"float16"`},
	}
	for _, tc := range tests {
		t.Run(tc.src+"/"+tc.dtype, func(t *testing.T) {
			src := filepath.Join("testdata", "export", tc.src)
			c, err := LoadConfig(src)
			if err != nil {
				t.Fatal(err)
			}
			c.DType = tc.dtype
			got, err := c.MarshalExport()
			if err != nil {
				t.Fatal(err)
			}
			want := src
			if tc.golden != "" {
				want = filepath.Join("testdata", "export", tc.golden)
			}
			checkGolden(t, want, got)
			if !strings.Contains(string(got), tc.key) {
				t.Errorf("no %s in\n%s", tc.key, got)
			}
			back, err := ParseConfig("export", got)
			if err != nil {
				t.Fatal(err)
			}
			if b, w := stripped(back), stripped(c); !sameArchitecture(&b, &w) || back.DType != tc.dtype {
				t.Errorf("the export parses as %+v, want %+v", b, w)
			}
		})
	}
}

// TestMarshalExportFallback: a config built in code, or changed after
// parsing in more than its dtype, is rendered by MarshalHF.
func TestMarshalExportFallback(t *testing.T) {
	parsed, err := LoadConfig(filepath.Join("testdata", "export", "qwen2-t5.json"))
	if err != nil {
		t.Fatal(err)
	}
	built := *parsed
	built.Raw, built.Source = nil, ""
	changed := *parsed
	changed.VocabSize = 512
	for name, c := range map[string]*Config{"built in code": &built, "changed": &changed} {
		got, err := c.MarshalExport()
		if err != nil {
			t.Fatal(err)
		}
		want, err := c.MarshalHF()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: MarshalExport differs from MarshalHF:\n%s", name, got)
		}
	}
}
