package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/model"
)

// TestExportCommand runs one step of the tiny recipe on a copy of its model
// that has a tokenizer and a generation config beside the weights, then
// exports it: in shards under a small --max-shard-size, with the files
// copied and reported; refused once the source directory has moved,
// naming it and --source; and found again with --source. A --max-shard-size
// that is no size is a usage error.
func TestExportCommand(t *testing.T) {
	tiny, err := filepath.Abs(filepath.Join("..", "..", "..", "examples", "models", "tiny-qwen2"))
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "tiny")
	files := map[string]string{
		"tokenizer.json":         `{"model": {"type": "WordLevel"}}`,
		"generation_config.json": `{"eos_token_id": 2}`,
	}
	for _, f := range []string{model.ConfigFileName, model.SingleFileName} {
		files[f] = string(readAll(t, filepath.Join(tiny, f)))
	}
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(src, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	spec := exampleVariant(t, "tiny-grpo.yaml", "path: "+tiny, "path: "+src)
	root := t.TempDir()
	if code, out, errs := runCLI(t, "run", "--runs", root, "--steps", "1", "--export", "", spec); code != exitOK {
		t.Fatalf("run: exit %d\n%s%s", code, out, errs)
	}
	run := onlyRun(t, root).Dir()
	dir := t.TempDir()

	if code, _, errs := runCLI(t, "export", "--max-shard-size", "5XB", run); code != exitUsage || !strings.Contains(errs, "--max-shard-size") {
		t.Errorf("--max-shard-size 5XB: exit %d\n%s", code, errs)
	}

	sharded := filepath.Join(dir, "sharded")
	code, out, errs := runCLI(t, "export", "--max-shard-size", "100KB", "--out", sharded, run)
	if code != exitOK {
		t.Fatalf("export --max-shard-size 100KB: exit %d\n%s%s", code, out, errs)
	}
	for _, want := range []string{"shards and " + model.IndexFileName, "copied 2 files from " + src + ": generation_config.json, tokenizer.json"} {
		if !strings.Contains(out, want) {
			t.Errorf("export --max-shard-size 100KB says\n%s\nwant %q", out, want)
		}
	}
	ck, err := model.OpenCheckpoint(sharded)
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err := model.LoadConfig(sharded); err != nil || ck.Index == "" || len(ck.Files) < 2 || ck.Check(cfg) != nil {
		t.Errorf("the sharded export: config %v, index %q, %d files", err, ck.Index, len(ck.Files))
	}
	ck.Close()
	for _, f := range []string{"tokenizer.json", "generation_config.json", model.ConfigFileName} {
		if got := string(readAll(t, filepath.Join(sharded, f))); got != files[f] {
			t.Errorf("%s in the export differs from the source's", f)
		}
	}

	moved := src + "-moved"
	if err := os.Rename(src, moved); err != nil {
		t.Fatal(err)
	}
	gone := filepath.Join(dir, "gone")
	code, _, errs = runCLI(t, "export", "--out", gone, run)
	if code != exitFailed || !strings.Contains(errs, src+", which no longer exists") || !strings.Contains(errs, "--source DIR") {
		t.Errorf("export with the source moved: exit %d\n%s", code, errs)
	}
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Errorf("a refused export wrote %s: %v", gone, err)
	}
	found := filepath.Join(dir, "found")
	code, out, errs = runCLI(t, "export", "--source", moved, "--out", found, run)
	if code != exitOK || !strings.Contains(out, "(HF checkpoint, "+model.SingleFileName+")") || !strings.Contains(out, "copied 2 files from "+moved) {
		t.Fatalf("export --source: exit %d\n%s%s", code, out, errs)
	}
}
