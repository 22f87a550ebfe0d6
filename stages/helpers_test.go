package stages

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/rlpipe/rlpipe/spec"
)

// testGPU is a CPU "device" with 16 GiB.
var testGPU = GPU{Name: "cpu", Bytes: 1 << 34, Source: "test"}

// resolveSpec resolves s for testGPU, as rlpipe run would.
func resolveSpec(t *testing.T, s *spec.Spec) *Job {
	t.Helper()
	j, err := Resolve(s, testGPU, CheckRun)
	if err != nil {
		t.Fatalf("resolve: %v", err)
	}
	return j
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// writeTemp writes a spec next to a copy of testdata/tiny so relative model
// paths still resolve.
func writeTemp(t *testing.T, name, src string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tiny"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := readFile(t, filepath.Join("testdata", "tiny", "config.json"))
	if err := os.WriteFile(filepath.Join(dir, "tiny", "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// sameUpdates fails the test unless two runs' steps logged the same
// updates (grad norms, LRs, tokens, metrics), bit for bit; what names
// the two runs.
func sameUpdates(t *testing.T, what string, a, b []StepResult) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d and %d steps", what, len(a), len(b))
	}
	for k := range a {
		if !reflect.DeepEqual(a[k].Stats.Updates, b[k].Stats.Updates) {
			t.Errorf("step %d: %s: updates %+v and %+v", a[k].Step, what, a[k].Stats.Updates, b[k].Stats.Updates)
		}
	}
}
