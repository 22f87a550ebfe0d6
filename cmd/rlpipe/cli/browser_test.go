package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlpipe/rlpipe/jobs"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/stages"
)

// findBrowser returns a headless-capable Chromium: $RLPIPE_BROWSER, else
// the first of chromium, chromium-browser, google-chrome on the PATH.
func findBrowser() (string, bool) {
	names := []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}
	if b := os.Getenv("RLPIPE_BROWSER"); b != "" {
		names = []string{b}
	}
	for _, n := range names {
		if path, err := exec.LookPath(n); err == nil {
			return path, true
		}
	}
	return "", false
}

// browse loads the page at path in headless Chromium, with the given
// extra flags, and returns what it printed on stdout.
func browse(t *testing.T, browser, path, fragment string, flags ...string) string {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--user-data-dir=" + t.TempDir()}, flags...)
	args = append(args, "file://"+abs+fragment)
	cmd := exec.CommandContext(ctx, browser, args...)
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", browser, strings.Join(args, " "), err, errs.String())
	}
	return out.String()
}

// attr returns the value of the attribute name of the first element of
// the DOM dump whose start tag matches tag, and whether it has it.
func attr(dom, tag, name string) (string, bool) {
	start := regexp.MustCompile(`<` + tag + `[^>]*>`).FindString(dom)
	m := regexp.MustCompile(`\s` + regexp.QuoteMeta(name) + `="([^"]*)"`).FindStringSubmatch(start)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// page is one page the test renders, and what its DOM must say once its
// script ran.
type page struct {
	name     string
	path     string
	fragment string            // the address's #fragment
	root     string            // the start tag of the element the script marks
	attrs    map[string]string // its attributes after the script ran
	text     []string          // in the DOM
}

// checkPage loads p in the browser, takes its screenshot into shots and
// checks its DOM once its script ran.
func checkPage(t *testing.T, browser, shots string, p page) {
	png := filepath.Join(shots, p.name+".png")
	// One start of the browser does both.
	dom := browse(t, browser, p.path, p.fragment, "--dump-dom", "--screenshot="+png, "--window-size=1400,900")
	if v, ok := attr(dom, p.root, "data-error"); ok {
		t.Errorf("%s: the page's script failed: %s", p.name, v)
	}
	for k, want := range p.attrs {
		if got, _ := attr(dom, p.root, k); got != want {
			t.Errorf("%s: %s is %q, want %q", p.name, k, got, want)
		}
	}
	for _, s := range p.text {
		if !strings.Contains(dom, s) {
			t.Errorf("%s: the rendered page lacks %q", p.name, s)
		}
	}
	if b, err := os.ReadFile(png); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) || len(b) < 10000 {
		t.Errorf("%s: no screenshot in %s (%d bytes, %v)", p.name, png, len(b), err)
	}
	t.Logf("%s: screenshot %s", p.name, png)
}

// timelinePage is what the plan --html page of spec must show.
func timelinePage(t *testing.T, name, spec, out string) page {
	t.Helper()
	code, stdout, stderr := runCLI(t, "plan", "--html", out, spec)
	if code != exitOK || !strings.Contains(stderr, "memory timeline written to "+out) || !strings.Contains(stdout, "FITS") {
		t.Fatalf("plan --html: exit %d\n%s%s", code, stdout, stderr)
	}
	l, err := load(spec, "", stages.CheckPlan)
	if err != nil {
		t.Fatal(err)
	}
	p, err := stages.Plan(l.job)
	if err != nil {
		t.Fatal(err)
	}
	tl := p.Timeline()
	peak := fmt.Sprintf("peak %s at op %d, %s (%s)", plan.Bytes(p.PeakBytes), tl.PeakOp, p.Ops[tl.PeakOp].Name, p.Ops[tl.PeakOp].Stage)
	return page{name: name, path: out, root: `section class="rlp-tl"`, fragment: "#op=" + strconv.Itoa(tl.PeakOp),
		attrs: map[string]string{"data-ready": "1", "data-check": "ok", "data-areas": strconv.Itoa(len(tl.Kinds)),
			"data-ops": strconv.Itoa(len(p.Ops)), "data-shown": strconv.Itoa(tl.PeakOp)},
		text: []string{peak, `class="rlp-tip"`}}
}

// TestBrowser renders the pictures in a real headless browser: the
// memory timeline of `plan --html` for a tiny example and a GPU one, and
// the `jobs report` of a tiny CPU run, and checks what their scripts
// drew. It saves the screenshots under $RLPIPE_SCREENSHOTS when set.
// Without Chromium it skips.
func TestBrowser(t *testing.T) {
	browser, ok := findBrowser()
	if !ok {
		t.Skip("no browser: install Chromium (apt-get install chromium) or set RLPIPE_BROWSER to run the pictures in one")
	}
	shots := os.Getenv("RLPIPE_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	} else if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	examples := filepath.Join("..", "..", "..", "examples")
	pages := []page{
		timelinePage(t, "plan-tiny-grpo", filepath.Join(examples, "tiny-grpo.yaml"), filepath.Join(dir, "tiny.html")),
		timelinePage(t, "plan-qwen2.5-0.5b-grpo-1gpu", filepath.Join(examples, "qwen2.5-0.5b-grpo-1gpu.yaml"), filepath.Join(dir, "qwen.html")),
	}

	// A tiny CPU run of 3 steps, and its report.
	root := filepath.Join(dir, "runs")
	if code, stdout, stderr := runCLI(t, "run", "--backend", "cpu", "--runs", root, "--steps", "3", "--export", "", filepath.Join(examples, "tiny-grpo.yaml")); code != exitOK {
		t.Fatalf("run: exit %d\n%s%s", code, stdout, stderr)
	}
	metas, err := jobs.List(root)
	if err != nil || len(metas) != 1 {
		t.Fatalf("runs: %v %v", metas, err)
	}
	code, stdout, stderr := runCLI(t, "jobs", "report", "--runs", root, metas[0].ID[:8])
	report := filepath.Join(metas[0].Dir, "report.html")
	if code != exitOK || !strings.Contains(stdout, "written to "+report) {
		t.Fatalf("jobs report: exit %d\n%s%s", code, stdout, stderr)
	}
	// loss (2 series), objective, KL, entropy, clipfrac, grad norm, lr,
	// tokens/s, and memory (measured and planned): 9 charts, 11 series.
	pages = append(pages, page{name: "jobs-report-tiny-grpo", path: report, root: `main class="rlp-report"`,
		attrs: map[string]string{"data-ready": "1", "data-charts": "9", "data-drawn": "9", "data-series": "11"},
		text:  []string{"not measured (CPU run)", "equal to the plan", `data-check="ok"`, "rlpipe run " + metas[0].ID[:8]}})
	for _, p := range pages {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			checkPage(t, browser, shots, p)
		})
	}
}

// TestPlanHTML checks plan --html without a browser: the page is written,
// said on stderr, and --json's stdout stays JSON alone.
func TestPlanHTML(t *testing.T) {
	out := filepath.Join(t.TempDir(), "timeline.html")
	code, stdout, stderr := runCLI(t, "plan", "--json", "--html", out, filepath.Join("..", "..", "..", "examples", "tiny-grpo.yaml"))
	if code != exitOK || !strings.HasPrefix(stdout, "{") || !strings.Contains(stderr, "memory timeline written to "+out) {
		t.Fatalf("plan --json --html: exit %d\n%s%s", code, stdout, stderr)
	}
	if b, err := os.ReadFile(out); err != nil || !bytes.Contains(b, []byte(`<path class="rlp-area"`)) {
		t.Errorf("the timeline page: %v", err)
	}
	if code, _, stderr := runCLI(t, "plan", "--html", filepath.Join(t.TempDir(), "no", "such", "dir.html"), filepath.Join("..", "..", "..", "examples", "tiny-grpo.yaml")); code != exitFailed {
		t.Errorf("plan --html into a missing directory: exit %d, want %d\n%s", code, exitFailed, stderr)
	}
}

// TestJobsReport checks jobs report without a browser, on a record made
// here: where it writes, -o, and its usage errors.
func TestJobsReport(t *testing.T) {
	root := t.TempDir()
	r, err := jobs.Create(root, jobs.Meta{Name: "made", TotalSteps: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.AppendMetrics(jobs.Metrics{Step: 1, Loss: 0.5}); err != nil {
		t.Fatal(err)
	}
	r.Close()
	id := r.ID()[:8]
	other := filepath.Join(t.TempDir(), "r.html")
	tests := []struct {
		args []string
		code int
		text string
		file string
	}{
		{[]string{"jobs", "report", "--runs", root, id}, exitOK, "written to " + filepath.Join(r.Dir(), "report.html"), filepath.Join(r.Dir(), "report.html")},
		{[]string{"jobs", "report", r.Dir(), "-o", other}, exitOK, "written to " + other, other},
		{[]string{"jobs", "report", "--runs", root}, exitUsage, "missing RUN", ""},
		{[]string{"jobs", "list", "--runs", root, "-o", other}, exitUsage, "-o is for jobs report", ""},
		{[]string{"jobs", "report", "--runs", root, "--json", id}, exitUsage, "--json is for jobs list and jobs show", ""},
		{[]string{"jobs", "report", "--runs", root, "nosuchrun"}, exitFailed, "run not found", ""},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args[1:], " "), func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tt.args...)
			if code != tt.code || !strings.Contains(stdout+stderr, tt.text) {
				t.Fatalf("exit %d, want %d with %q\n%s%s", code, tt.code, tt.text, stdout, stderr)
			}
			if tt.file == "" {
				return
			}
			if b, err := os.ReadFile(tt.file); err != nil || !bytes.Contains(b, []byte("rlpipe run "+id+": made")) {
				t.Errorf("%s: %v", tt.file, err)
			}
		})
	}
}
