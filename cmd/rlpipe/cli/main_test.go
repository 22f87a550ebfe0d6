package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s:\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func TestBrokenSpec(t *testing.T) {
	code, _, stderr := runCLI(t, "validate", filepath.Join("testdata", "broken.yaml"))
	if code != exitInvalid {
		t.Errorf("exit code %d, want %d", code, exitInvalid)
	}
	golden(t, "broken.golden", stderr)
}

// onlyMissingFiles checks that validate's report on a recipe shipped
// without weights and rollouts names exactly those, and nothing else: the
// model's missing weights and the missing rollout file.
func onlyMissingFiles(t *testing.T, code int, stderr string) {
	t.Helper()
	if code != exitInvalid {
		t.Fatalf("validate exit %d, want %d (the weights and rollouts are not shipped):\n%s", code, exitInvalid, stderr)
	}
	var problems []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.Contains(l, ".yaml:") && !strings.HasPrefix(strings.TrimSpace(l), "|") {
			problems = append(problems, l)
		}
	}
	if len(problems) != 2 || !strings.Contains(problems[0], "no model.safetensors") || !strings.Contains(problems[1], "rollouts.jsonl: no such file") {
		t.Errorf("validate reports %d problems, want the missing weights and rollouts only:\n%s", len(problems), strings.Join(problems, "\n"))
	}
}

// TestExamples runs validate and plan on every shipped example: the tiny
// ones validate; the others ship config.json alone and no rollouts, and
// validate names exactly those as what rlpipe run would miss.
func TestExamples(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "examples", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples found: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			code, _, stderr := runCLI(t, "validate", f)
			if strings.HasPrefix(filepath.Base(f), "tiny-") {
				if code != exitOK {
					t.Fatalf("validate exit %d:\n%s", code, stderr)
				}
			} else {
				onlyMissingFiles(t, code, stderr)
			}
			code, stdout, stderr := runCLI(t, "plan", f)
			if code != exitOK {
				t.Fatalf("plan exit %d:\n%s%s", code, stdout, stderr)
			}
			for _, want := range []string{"<- peak", "arena", "FITS"} {
				if !strings.Contains(stdout, want) {
					t.Errorf("plan output lacks %q:\n%s", want, stdout)
				}
			}
			code, stdout, _ = runCLI(t, "plan", "--json", f)
			if code != exitOK {
				t.Fatalf("plan --json exit %d", code)
			}
			var p struct {
				Fits   bool  `json:"fits"`
				Arena  int64 `json:"device_arena_bytes"`
				Peak   int64 `json:"peak_bytes"`
				Budget []struct {
					Stage string `json:"stage"`
				} `json:"budget"`
			}
			if err := json.Unmarshal([]byte(stdout), &p); err != nil {
				t.Fatalf("plan --json is not JSON: %v", err)
			}
			if !p.Fits || p.Arena < p.Peak || p.Peak <= 0 || len(p.Budget) == 0 {
				t.Errorf("implausible plan JSON: fits %v arena %d peak %d stages %d", p.Fits, p.Arena, p.Peak, len(p.Budget))
			}
			// docs/memory.md promises the greedy offsets stay within 2% of the peak.
			if float64(p.Arena) > 1.02*float64(p.Peak) {
				t.Errorf("arena %d is more than 2%% above the peak %d", p.Arena, p.Peak)
			}
			if code, stdout, _ := runCLI(t, "graph", "--dot", f); code != exitOK || !strings.HasPrefix(stdout, "digraph") {
				t.Errorf("graph --dot exit %d: %.40q", code, stdout)
			}
		})
	}
}

func TestExitCodes(t *testing.T) {
	ex := filepath.Join("..", "..", "..", "examples", "qwen2.5-7b-grpo-8xh100.yaml")
	tests := []struct {
		name string
		args []string
		want int
		text string // expected in stdout+stderr
	}{
		{"no args", nil, exitUsage, "Usage"},
		{"unknown command", []string{"frobnicate"}, exitUsage, "unknown command"},
		{"help", []string{"help"}, exitOK, "Commands"},
		{"missing file", []string{"validate", "testdata/nope.yaml"}, exitInvalid, "nope.yaml"},
		{"plan does not fit", []string{"plan", "--gpu", "10000000000", ex}, exitNoFit, "DOES NOT FIT"},
		{"bad --gpu", []string{"plan", "--gpu", "h900-1t", ex}, exitUsage, "--gpu"},
		{"host does not fit", []string{"plan", "--gpu", "h100-80g", "--host-memory", "16GiB", filepath.Join("..", "..", "..", "examples", "llama-3.1-8b-offload-8gpu.yaml")}, exitNoFit, "GiB over the host's RAM"},
		{"host fits", []string{"plan", "--gpu", "h100-80g", "--host-memory", "1TiB", filepath.Join("..", "..", "..", "examples", "llama-3.1-8b-offload-8gpu.yaml")}, exitOK, "8 rank(s) × (pinned + buffers + process), of 1024.00 GiB RAM (--host-memory)"},
		{"bad --host-memory", []string{"plan", "--host-memory", "lots", ex}, exitUsage, "--host-memory"},
		{"bad --export-dtype", []string{"run", "--runs", "testdata/no-runs", "--export-dtype", "int8", tinySpec}, exitUsage, "--export-dtype"},
		{"bad --backend", []string{"run", "--runs", "testdata/no-runs", "--backend", "tpu", tinySpec}, exitUsage, "--backend"},
		{"bad --export model", []string{"run", "--runs", "testdata/no-runs", "--export", "critic", tinySpec}, exitUsage, "no apply_fsdp2 stage shards model \"critic\""},
		{"plan needs one file", []string{"plan"}, exitUsage, "missing SPEC.yaml"},
		{"stages lists kinds", []string{"stages"}, exitOK, "update_ref"},
		{"version", []string{"version"}, exitOK, "rlpipe"},
		{"run needs weights and data", []string{"run", "--runs", "testdata/no-runs", filepath.Join("..", "..", "..", "examples", "qwen2.5-0.5b-grpo-1gpu.yaml")}, exitInvalid, "no model.safetensors"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tt.args...)
			if code != tt.want {
				t.Errorf("exit %d, want %d\n%s%s", code, tt.want, stdout, stderr)
			}
			if !strings.Contains(stdout+stderr, tt.text) {
				t.Errorf("output lacks %q:\n%s%s", tt.text, stdout, stderr)
			}
		})
	}
}

// TestReadmeRecipe validates the recipe the README shows, as if it were
// saved in examples/ (its model paths are relative to that directory), so
// the first page cannot drift from the spec.
func TestReadmeRecipe(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "## A recipe\n\n```yaml\n")
	if !ok {
		t.Fatal("README has no yaml block under \"## A recipe\"")
	}
	recipe, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("README's recipe block is not closed")
	}
	dir := t.TempDir()
	models, err := filepath.Abs(filepath.Join("..", "..", "..", "examples", "models"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(models, filepath.Join(dir, "models")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "readme.yaml")
	if err := os.WriteFile(path, []byte(recipe), 0o644); err != nil {
		t.Fatal(err)
	}
	// The recipe names a model and rollouts the repo does not ship:
	// validate must name exactly those.
	code, _, stderr := runCLI(t, "validate", path)
	onlyMissingFiles(t, code, stderr)
	if code, out, _ := runCLI(t, "plan", path); code != exitOK || !strings.Contains(out, "FITS") {
		t.Errorf("plan of the README's recipe: exit %d\n%s", code, out)
	}
}

// TestReadmePlanOutput checks that the `rlpipe plan` output the README shows
// is what rlpipe prints today.
func TestReadmePlanOutput(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	const cmd = "$ rlpipe plan examples/qwen2.5-0.5b-grpo-1gpu.yaml\n"
	_, rest, ok := strings.Cut(string(readme), cmd)
	if !ok {
		t.Fatalf("README does not show %q", cmd)
	}
	shown, _, _ := strings.Cut(rest, "```")
	code, out, stderr := runCLI(t, "plan", filepath.Join("..", "..", "..", "examples", "qwen2.5-0.5b-grpo-1gpu.yaml"))
	if code != exitOK {
		t.Fatalf("plan exit %d: %s", code, stderr)
	}
	trim := func(s string) string {
		lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
		for i, l := range lines {
			lines[i] = strings.TrimRight(l, " ")
		}
		return strings.Join(lines, "\n")
	}
	if trim(shown) != trim(out) {
		t.Errorf("README's plan output is stale; rlpipe prints:\n%s", out)
	}
}

// doctor reports every library it looks for, found or not, and the
// backends it can offer; without a GPU that is the CPU alone.
func TestDoctor(t *testing.T) {
	code, out, stderr := runCLI(t, "doctor")
	if code != exitOK {
		t.Fatalf("doctor exit %d: %s", code, stderr)
	}
	for _, prefix := range []string{"rlpipe ", "nvml", "nccl: ", "backends: cpu"} {
		found := false
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, prefix) {
				found = true
			}
		}
		if !found {
			t.Errorf("no line starting %q in:\n%s", prefix, out)
		}
	}
}

func TestCheckGPUMesh(t *testing.T) {
	for _, c := range []struct {
		nodes, dp, gpus int
		want            string // "" for no error
	}{
		{1, 1, 1, ""},
		{1, 2, 2, ""},
		{1, 2, 8, ""},
		{1, 4, 2, "4 ranks (dp × cp) and this host has 2 GPUs"},
		{2, 16, 8, "2 nodes"},
	} {
		err := checkGPUMesh(c.nodes, c.dp, c.gpus)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("checkGPUMesh(%d, %d, %d): %v", c.nodes, c.dp, c.gpus, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("checkGPUMesh(%d, %d, %d) = %v, want an error about %q", c.nodes, c.dp, c.gpus, err, c.want)
		}
	}
}

// TestLongContextPlan is the plan's proof that context parallelism makes
// a sequence fit that one GPU cannot hold: the example's 256k-token
// samples fit two H100s as cp 2, and do not as dp 2 (cp 1, with every
// sample whole on a GPU).
func TestLongContextPlan(t *testing.T) {
	ex, err := filepath.Abs(filepath.Join("..", "..", "..", "examples", "qwen2.5-1.5b-long-cp2.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, "plan", ex)
	if code != exitOK {
		t.Fatalf("cp 2: plan exit %d:\n%s%s", code, stdout, stderr)
	}
	for _, want := range []string{"dp 1 × cp 2", "ring attention", "a rank holds 131072 rows", "FITS"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("cp 2: plan output lacks %q:\n%s", want, stdout)
		}
	}
	src := readText(t, ex)
	for _, r := range [][2]string{
		{"path: models/", "path: " + filepath.Dir(ex) + "/models/"},
		{"  cp: 2 ", "  cp: 1 "},
		{"max_tokens_per_gpu: 131072 ", "max_tokens_per_gpu: 262144 "},
	} {
		if !strings.Contains(src, r[0]) {
			t.Fatalf("%s has no %q", ex, r[0])
		}
		src = strings.Replace(src, r[0], r[1], 1)
	}
	dp2 := filepath.Join(t.TempDir(), "dp2.yaml")
	if err := os.WriteFile(dp2, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runCLI(t, "plan", dp2)
	if code != exitNoFit || !strings.Contains(stdout, "dp 2, 262144 tokens") || !strings.Contains(stdout, "DOES NOT FIT") {
		t.Errorf("cp 1: plan exit %d, want %d (does not fit):\n%s%s", code, exitNoFit, stdout, stderr)
	}
}

// exampleVariant writes a copy of examples/NAME whose model and rollout
// paths point at the examples and whose text has the replacements of
// pairs, and returns its path.
func exampleVariant(t *testing.T, name string, pairs ...string) string {
	t.Helper()
	path := filepath.Join("..", "..", "..", "examples", name)
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.NewReplacer("path: models/", "path: "+ex+"/models/", "rollouts: data/", "rollouts: "+ex+"/data/").Replace(string(src))
	for i := 0; i+1 < len(pairs); i += 2 {
		if !strings.Contains(text, pairs[i]) {
			t.Fatalf("%s has no %q", name, pairs[i])
		}
		text = strings.Replace(text, pairs[i], pairs[i+1], 1)
	}
	out := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(out, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}
