package stages

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/spec"
)

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sourceJob resolves the tiny job with its actor loaded from a copy of the
// tiny checkpoint (config.json and model.safetensors) in a new directory,
// to which files adds more: name → content, a name ending in "/" a
// directory, content "->PATH" a symbolic link to PATH. It returns the job
// and the source directory.
func sourceJob(t *testing.T, files map[string]string) (*Job, string) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "source")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	tiny := filepath.Join("..", "examples", "models", "tiny-qwen2")
	for _, f := range []string{model.ConfigFileName, model.SingleFileName} {
		if err := os.WriteFile(filepath.Join(src, f), []byte(readFile(t, filepath.Join(tiny, f))), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, content := range files {
		path := filepath.Join(src, name)
		err := os.MkdirAll(filepath.Dir(path), 0o755)
		switch {
		case err != nil:
		case strings.HasSuffix(name, "/"):
			err = os.MkdirAll(path, 0o755)
		case strings.HasPrefix(content, "->"):
			err = os.Symlink(content[2:], path)
		default:
			err = os.WriteFile(path, []byte(content), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	s, err := spec.Load(filepath.Join("..", "examples", "tiny-grpo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	s.Models[0].Path = src
	return resolveSpec(t, s), src
}

// sourceRows are the actor's parameters as one rank's rows on a mesh of
// one, read from its checkpoint: what ExportHF needs, without a run.
func sourceRows(t *testing.T, m *Model) []ShardRows {
	t.Helper()
	rows := ShardRows{}
	for _, u := range m.Config.Units() {
		for _, s := range m.Config.Layout(u, 1) {
			if s.Tied {
				continue
			}
			data := make([]float32, s.Elems())
			if err := m.Checkpoint.ReadRows(s.Name, 0, s.Shape[0], data); err != nil {
				t.Fatal(err)
			}
			rows[s.Name] = data
		}
	}
	return []ShardRows{rows}
}

// TestExportSourceFiles exports a model whose source directory holds
// tokenizer files and the like beside the weights: every file but the
// weights, their indexes, config.json, hidden files and subdirectories is
// copied, byte for byte (through a symbolic link too, as in the Hugging
// Face cache), and config.json is the source's.
func TestExportSourceFiles(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(outside, []byte("a blob of the HF cache"), 0o644); err != nil {
		t.Fatal(err)
	}
	copied := map[string]string{
		"tokenizer.json":          `{"version": "1.0", "model": {"type": "WordLevel"}}`,
		"tokenizer_config.json":   `{"eos_token": "</s>", "chat_template": "{{ messages }}"}`,
		"special_tokens_map.json": `{"eos_token": "</s>"}`,
		"vocab.json":              `{"a": 0}`,
		"merges.txt":              "#version: 0.2\na b\n",
		"tokenizer.model":         "\x00\x01sentencepiece\xff",
		"added_tokens.json":       `{"<tool>": 256}`,
		"chat_template.jinja":     "{% for m in messages %}{{ m.content }}{% endfor %}",
		"generation_config.json":  `{"eos_token_id": 2, "temperature": 0.7}`,
		"README.md":               "# a model\n",
		"LICENSE":                 "Apache-2.0\n",
		"merges-linked.txt":       "->" + outside,
	}
	skipped := map[string]string{
		"pytorch_model.bin":            "weights",
		"pytorch_model.bin.index.json": `{"weight_map": {}}`,
		"tf_model.h5":                  "weights",
		"flax_model.msgpack":           "weights",
		"consolidated.pth":             "weights",
		"optimizer.pt":                 "state",
		"training_args.bin":            "args",
		"model.gguf":                   "weights",
		".gitattributes":               "*.safetensors filter=lfs",
		"original/":                    "",
		"original/params.json":         "{}",
	}
	files := map[string]string{}
	for k, v := range copied {
		files[k] = v
	}
	for k, v := range skipped {
		files[k] = v
	}
	j, src := sourceJob(t, files)
	m := j.Models["actor"]
	out := filepath.Join(t.TempDir(), "export")
	e, err := ExportHF(m, 1, sourceRows(t, m), out, ExportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for name := range copied {
		want = append(want, name)
	}
	slices.Sort(want)
	if !slices.Equal(e.Copied, want) || e.Source != src {
		t.Errorf("copied %v from %s, want %v from %s", e.Copied, e.Source, want, src)
	}
	for _, name := range want {
		if got, want := readFile(t, filepath.Join(out, name)), readFile(t, filepath.Join(src, name)); got != want {
			t.Errorf("%s: the copy differs from the source", name)
		}
	}
	entries, _ := os.ReadDir(out)
	var all []string
	for _, d := range entries {
		all = append(all, d.Name())
	}
	wantAll := append(slices.Clone(want), model.ConfigFileName, model.SingleFileName)
	slices.Sort(wantAll)
	if !slices.Equal(all, wantAll) {
		t.Errorf("the export holds %v, want %v", all, wantAll)
	}
	// The config's dtype (float32) is the export's: config.json unchanged.
	if readFile(t, filepath.Join(out, model.ConfigFileName)) != readFile(t, filepath.Join(src, model.ConfigFileName)) {
		t.Error("config.json differs from the source's")
	}
}

// TestExportSource checks the source directory's cases: one with nothing
// but the config and weights exports with no copies; a source removed since
// the job was resolved is refused before anything is written, naming the
// directory; the source directory itself is refused as the output.
func TestExportSource(t *testing.T) {
	j, src := sourceJob(t, nil)
	m := j.Models["actor"]
	rows := sourceRows(t, m)
	out := filepath.Join(t.TempDir(), "export")
	e, err := ExportHF(m, 1, rows, out, ExportOptions{DType: "bf16"})
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Copied) != 0 || !slices.Equal(e.Weights, []string{model.SingleFileName}) {
		t.Errorf("copied %v, weights %v; want nothing copied, one model.safetensors", e.Copied, e.Weights)
	}
	if cfg, err := model.LoadConfig(out); err != nil || cfg.DType != "bfloat16" {
		t.Errorf("the export's config: %v, dtype %v; want bfloat16", err, cfg)
	}
	if _, err := ExportHF(m, 1, rows, src, ExportOptions{}); err == nil || !strings.Contains(err.Error(), "source checkpoint directory") {
		t.Errorf("exporting into the source directory: %v, want it refused", err)
	}
	ref := j.Models["ref"] // a copy of the actor: the same source
	if ref.Dir != src {
		t.Fatalf("the ref's source is %q, want the actor's %q", ref.Dir, src)
	}
	if err := os.RemoveAll(src); err != nil {
		t.Fatal(err)
	}
	gone := filepath.Join(t.TempDir(), "gone")
	for _, mm := range []*Model{m, ref} {
		_, err := ExportHF(mm, 1, rows, gone, ExportOptions{})
		if !errors.Is(err, ErrSourceMissing) || !strings.Contains(err.Error(), src) || !strings.Contains(err.Error(), "restore") {
			t.Errorf("%s: exporting with the source gone: %v, want ErrSourceMissing naming %s", mm.Name(), err, src)
		}
	}
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Errorf("a refused export created %s: %v", gone, err)
	}
}
