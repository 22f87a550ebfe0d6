package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
)

// fitsWith plans the spec at path as if its file set data.max_seq_len to
// n and data.max_tokens_per_gpu to rows, and reports whether it fits gpu
// bytes: the check `rlpipe plan` makes, on an edited copy of the text.
func fitsWith(t *testing.T, path, gpuBytes string, n, rows int) bool {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := regexp.MustCompile(`(?m)^  max_seq_len: \d+`).ReplaceAllString(string(src), fmt.Sprintf("  max_seq_len: %d", n))
	text = regexp.MustCompile(`(?m)^  max_tokens_per_gpu: \d+`).ReplaceAllString(text, fmt.Sprintf("  max_tokens_per_gpu: %d", rows))
	s, err := spec.Parse(path, []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	l, err := resolveSpec(s, gpuBytes, stages.CheckPlan)
	if err != nil {
		t.Fatalf("%d tokens: %v", n, err)
	}
	p, err := stages.Plan(l.job)
	if err != nil {
		t.Fatalf("%d tokens: %v", n, err)
	}
	return p.Fits(l.job.GPU.Bytes)
}

// TestPlanLongest runs `rlpipe plan --longest` on the tiny recipes at cp 1
// and 2: the length it names fits, one step more does not (planned from
// the spec's text with those lengths), the JSON says the same, and the
// rows per GPU are the sample's rows on each cp rank.
func TestPlanLongest(t *testing.T) {
	ex := filepath.Join("..", "..", "..", "examples")
	for _, c := range []struct {
		spec, gpu string
		cp        int
	}{
		{"tiny-grpo.yaml", "1000000000", 1},
		{"tiny-cp2.yaml", "5000000000", 2},
	} {
		path := filepath.Join(ex, c.spec)
		code, out, stderr := runCLI(t, "plan", "--gpu", c.gpu, "--longest", "--longest-step", "256", path)
		if code != exitOK {
			t.Fatalf("%s: exit %d: %s", c.spec, code, stderr)
		}
		m := regexp.MustCompile(`LONGEST: samples of (\d+) tokens fit \(data.max_seq_len \d+, max_tokens_per_gpu (\d+); searched in steps of 256\); (\d+) tokens do not`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("%s: no LONGEST line in:\n%s", c.spec, out)
		}
		var n, rows, next int
		fmt.Sscan(m[1]+" "+m[2]+" "+m[3], &n, &rows, &next)
		if n%256 != 0 || next != n+256 || rows != spec.SeqRows(n, c.cp) {
			t.Errorf("%s: longest %d, rows %d, next %d", c.spec, n, rows, next)
		}
		if !fitsWith(t, path, c.gpu, n, rows) {
			t.Errorf("%s: %d tokens (%d rows) do not fit", c.spec, n, rows)
		}
		if fitsWith(t, path, c.gpu, next, spec.SeqRows(next, c.cp)) {
			t.Errorf("%s: %d tokens fit too", c.spec, next)
		}
		if !strings.Contains(out, fmt.Sprintf("%d tokens per micro-batch per GPU", rows)) {
			t.Errorf("%s: the plan shown is not the longest's (%d rows):\n%s", c.spec, rows, out)
		}
		code, out, _ = runCLI(t, "plan", "--gpu", c.gpu, "--longest", "--longest-step", "256", "--json", path)
		var j struct {
			Fits    bool    `json:"fits"`
			Longest longest `json:"longest"`
		}
		if err := json.Unmarshal([]byte(out), &j); err != nil || code != exitOK {
			t.Fatalf("%s --json: exit %d, %v", c.spec, code, err)
		}
		if !j.Fits || j.Longest.Tokens != n || j.Longest.MaxTokensPerGPU != rows || j.Longest.Next != next || j.Longest.NextBytes == 0 {
			t.Errorf("%s --json: %+v, want %d tokens, %d rows, next %d", c.spec, j, n, rows, next)
		}
	}
}

// TestPlanLongestData checks that the search's lengths are not held to
// the rollout file's: tiny-grpo.yaml's samples have 24 tokens, and the
// search starts at 16.
func TestPlanLongestData(t *testing.T) {
	path := filepath.Join("..", "..", "..", "examples", "tiny-grpo.yaml")
	code, out, stderr := runCLI(t, "plan", "--gpu", "1000000000", "--longest", "--longest-step", "16", path)
	if code != exitOK {
		t.Fatalf("exit %d: %s%s", code, out, stderr)
	}
	m := regexp.MustCompile(`LONGEST: samples of (\d+) tokens fit`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no LONGEST line in:\n%s", out)
	}
	if n, _ := strconv.Atoi(m[1]); n < 256 {
		t.Errorf("longest %d tokens; TestPlanLongest finds more on this GPU", n)
	}
}

// TestPlanLongestRefused covers what --longest cannot search: nothing
// fits, a bad step, and a pack stage with its own budget.
func TestPlanLongestRefused(t *testing.T) {
	ex := filepath.Join("..", "..", "..", "examples")
	code, out, _ := runCLI(t, "plan", "--gpu", "800000000", "--longest", filepath.Join(ex, "tiny-grpo.yaml"))
	if code != exitNoFit || !strings.Contains(out, "LONGEST: not even samples of 1024 tokens fit; 1024 tokens do not") {
		t.Errorf("nothing fits: exit %d:\n%s", code, out)
	}
	code, _, stderr := runCLI(t, "plan", "--longest", "--longest-step", "0", filepath.Join(ex, "tiny-grpo.yaml"))
	if code != exitUsage || !strings.Contains(stderr, "--longest-step") {
		t.Errorf("step 0: exit %d: %s", code, stderr)
	}
	src, err := os.ReadFile(filepath.Join(ex, "tiny-grpo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(src), "      uses: pack\n", "      uses: pack\n      with: {max_tokens_per_gpu: 768}\n", 1)
	if text == string(src) {
		t.Fatal("tiny-grpo.yaml has no pack stage to edit")
	}
	path := filepath.Join(ex, ".longest-pack-test.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	code, _, stderr = runCLI(t, "plan", "--gpu", "h100-80g", "--longest", path)
	if code == exitOK || !strings.Contains(stderr, `stage "pack" sets its own max_tokens_per_gpu (768)`) {
		t.Errorf("pack with its own budget: exit %d: %s", code, stderr)
	}
}
