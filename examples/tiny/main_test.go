package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestCommittedFilesRegenerate checks that the tiny model, rollouts and prompts under
// examples/ are exactly what Write produces: the embedded default is
// generated deterministically, not hand-edited.
func TestCommittedFilesRegenerate(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{
		filepath.Join("models", "tiny-qwen2", "config.json"),
		filepath.Join("models", "tiny-qwen2", "model.safetensors"),
		filepath.Join("data", "tiny-rollouts.jsonl"),
		filepath.Join("data", "tiny-prompts.jsonl"),
	} {
		got, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join("..", f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what `go run ./examples/tiny` writes", f)
		}
		if st, err := os.Stat(filepath.Join(dir, f)); err == nil && st.Mode().Perm() != 0o644 {
			t.Errorf("%s has mode %v, want 0644", f, st.Mode().Perm())
		}
	}
}
