package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/jobs"
	"github.com/rlpipe/rlpipe/runtime/plan"
)

// record describes a run record for a test to write.
type record struct {
	steps, updatesPerStep int
	backend               string             // the run log's backend; "" writes no log
	extra                 map[string]float64 // added to every step line
	nanAt                 int                // the update whose loss is NaN (0: none)
	plan                  bool               // write plan.json
}

// tinyPlan is a plan of two stages whose peak is 3 MiB at op 1.
func tinyPlan(t *testing.T) *plan.Plan {
	t.Helper()
	b := plan.NewBuilder()
	b.BeginStage("shard", "apply_fsdp2", "setup")
	b.Persistent("actor.params", plan.Params, 1<<20, false, b.Op("shard"))
	b.BeginStage("train", "train", "step")
	i := b.Op("forward")
	b.Alloc("train.act", plan.Activations, 2<<20, i, i)
	b.Alloc("train.grad", plan.Grads, 1<<20, b.Op("backward"), b.Now())
	b.AddReserve(plan.Reserve{Name: "cuda_context", Bytes: 768 << 20})
	p, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// write makes the run record rec describes under a temporary root.
func (rec record) write(t *testing.T) *jobs.Run {
	t.Helper()
	r, err := jobs.Create(t.TempDir(), jobs.Meta{Name: "tiny <run>", SpecPath: "tiny.yaml", TotalSteps: max(rec.steps, 1), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if rec.plan {
		if err := r.WritePlan(tinyPlan(t)); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.WriteResolved(map[string]any{"Name": "tiny", "GPU": map[string]any{"Name": "h100-80g", "Bytes": 80 << 30, "Source": "spec"},
		"Mesh": map[string]any{"Nodes": 1, "GPUsPerNode": 2, "DP": 2, "CP": 1}, "UpdatesPerStep": rec.updatesPerStep}); err != nil {
		t.Fatal(err)
	}
	if rec.backend != "" {
		f, err := r.LogFile()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(f, `{"level":"info","backend":%q,"message":"run started"}`+"\n", rec.backend)
		f.Close()
	}
	update := 0
	for s := 1; s <= rec.steps; s++ {
		for k := 0; k < rec.updatesPerStep; k++ {
			update++
			loss := 1 / float64(update)
			if update == rec.nanAt {
				loss = math.NaN()
			}
			if err := r.AppendUpdate(jobs.Metrics{Step: s, Update: update, Loss: loss, KL: 0.01 * float64(update), LR: 1e-3, Extra: map[string]float64{"adv_logp": 0.1}}); err != nil {
				t.Fatal(err)
			}
		}
		m := jobs.Metrics{Step: s, Updates: rec.updatesPerStep, Loss: 1 / float64(s), TokensPerS: 1000 + float64(s), PeakMemBytes: 3 << 20, Extra: rec.extra}
		if err := r.AppendMetrics(m); err != nil {
			t.Fatal(err)
		}
	}
	if rec.steps > 0 {
		if err := r.SetStatus(jobs.StatusSucceeded, nil); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

var (
	dataRE   = regexp.MustCompile(`(?s)<script type="application/json" id="rlp-report-data">(.*?)</script>`)
	figureRE = regexp.MustCompile(`<figure class="chart" data-chart="([^"]*)" data-series="(\d+)"`)
)

func TestReport(t *testing.T) {
	tests := []struct {
		name   string
		rec    record
		charts []string // the charts' titles, memory last
		want   []string
		not    []string
	}{
		{
			name:   "cpu run, updates, a NaN",
			rec:    record{steps: 3, updatesPerStep: 2, backend: "cpu", nanAt: 3, plan: true},
			charts: []string{"loss", "reward-weighted objective", "KL", "entropy", "clipfrac", "grad norm", "learning rate", "tokens/s", "memory per step"},
			want: []string{"not measured (CPU run)", "NaN at step 2 (update 3), not drawn", "per optimizer update (updates.jsonl)",
				"equal to the plan", `class="rlp-tl"`, "Memory timeline: tiny", "Not in this record: reward.", "tiny &lt;run&gt;", "2 rank(s), dp 2"},
			not: []string{"tiny <run>"},
		},
		{
			name: "cuda run, NVML over the plan, a reward",
			rec: record{steps: 2, updatesPerStep: 1, backend: "cuda", plan: true,
				extra: map[string]float64{NVMLKey: 900 << 20, "reward_mean": 0.5}},
			charts: []string{"loss", "reward", "reward-weighted objective", "KL", "entropy", "clipfrac", "grad norm", "learning rate", "tokens/s", "memory per step"},
			want:   []string{"900.00 MiB, NVML, the most of 2 step(s)", "over the plan", "NVML, rank 0 (measured)", "device total (planned)", "<dd>cuda</dd>"},
			not:    []string{"not measured"},
		},
		{
			name:   "one step, no update lines, no plan",
			rec:    record{steps: 1},
			charts: []string{"loss", "KL", "entropy", "clipfrac", "grad norm", "learning rate", "tokens/s", "memory per step"},
			want:   []string{"no plan in the record", "The record has no plan with ops", "per step (metrics.jsonl)", "unknown (the run log does not say)", "not measured (the record has no NVML figure)"},
			not:    []string{`class="rlp-tl"`, "updates.jsonl"},
		},
		{
			name: "no step yet",
			rec:  record{plan: true, backend: "cpu"},
			want: []string{"The run recorded no step yet", "no step recorded", `class="rlp-tl"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.rec.write(t)
			var page bytes.Buffer
			if err := Write(&page, r); err != nil {
				t.Fatal(err)
			}
			html := page.String()
			if dir := os.Getenv("RLPIPE_SCREENSHOTS"); dir != "" {
				name := "report-" + strings.NewReplacer(" ", "-", ",", "").Replace(tt.name) + ".html"
				if err := os.WriteFile(filepath.Join(dir, name), page.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for _, w := range tt.want {
				if !strings.Contains(html, w) {
					t.Errorf("the page lacks %q", w)
				}
			}
			for _, w := range tt.not {
				if strings.Contains(html, w) {
					t.Errorf("the page has %q", w)
				}
			}
			for _, bad := range []string{"://", "<link", " src=", "@import", "url(", "ZgotmplZ"} {
				if strings.Contains(html, bad) {
					t.Errorf("the page has %q: it fetches something, or a value html/template refused", bad)
				}
			}
			d := embedded(t, html)
			figs := figureRE.FindAllStringSubmatch(html, -1)
			if len(figs) != len(tt.charts) || len(d.Charts) != len(tt.charts) {
				t.Fatalf("%d figures and %d charts in the data, want %d", len(figs), len(d.Charts), len(tt.charts))
			}
			for i, f := range figs {
				if f[1] != d.Charts[i].ID || f[2] != fmt.Sprint(len(d.Charts[i].Series)) {
					t.Errorf("figure %s with %s series, data %s with %d", f[1], f[2], d.Charts[i].ID, len(d.Charts[i].Series))
				}
				if !strings.Contains(html, "<b>"+escaped(tt.charts[i])+"</b>") {
					t.Errorf("chart %d is not %q", i, tt.charts[i])
				}
			}
		})
	}
}

// embedded returns the data the page embeds for its script.
func embedded(t *testing.T, html string) pageData {
	t.Helper()
	var d pageData
	m := dataRE.FindStringSubmatch(html)
	if m == nil {
		t.Fatal("the page embeds no data")
	}
	if err := json.Unmarshal([]byte(m[1]), &d); err != nil {
		t.Fatalf("the page's data: %v", err)
	}
	return d
}

// escaped escapes s as the page does.
func escaped(s string) string { return strings.NewReplacer("<", "&lt;", ">", "&gt;").Replace(s) }

func TestUpdatePoints(t *testing.T) {
	us := []jobs.Metrics{{Step: 1}, {Step: 1}, {Step: 1}, {Step: 1}, {Step: 2}, {Step: 3}, {Step: 3}}
	want := []float64{0.25, 0.5, 0.75, 1, 2, 2.5, 3}
	got := updatePoints(us)
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-12 {
			t.Fatalf("updatePoints = %v, want %v", got, want)
		}
	}
}

func TestChartLayout(t *testing.T) {
	pts := func(ys ...float64) []point {
		var ps []point
		for i, y := range ys {
			ps = append(ps, point{X: float64(i + 1), Y: y, Step: i + 1})
		}
		return ps
	}
	tests := []struct {
		name              string
		points            []point
		paths, dots, nans int
		notes             int
	}{
		{"one point", pts(3), 1, 1, 0, 0},
		{"constant", pts(2, 2, 2), 1, 3, 0, 0},
		{"zeros", pts(0, 0), 1, 2, 0, 0},
		{"a NaN splits the line", pts(1, math.NaN(), 3, 4), 1, 3, 1, 1},
		{"only infinities", pts(math.Inf(1), math.Inf(-1)), 0, 0, 2, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := (&chart{ID: "c", Format: "num", Series: []series{{Name: "v", Color: "#000", Points: tt.points}}}).layout()
			if len(c.Paths) != tt.paths || len(c.Dots) != tt.dots || len(c.Marks) != tt.nans || len(c.Notes) != tt.notes {
				t.Errorf("%d paths, %d dots, %d marks, %d notes; want %d, %d, %d, %d", len(c.Paths), len(c.Dots), len(c.Marks), len(c.Notes), tt.paths, tt.dots, tt.nans, tt.notes)
			}
			if !(c.ymin < c.ymax) || !(c.xmin < c.xmax) || len(c.YTicks) == 0 || len(c.XTicks) == 0 {
				t.Errorf("domain x [%g, %g] y [%g, %g], %d and %d ticks", c.xmin, c.xmax, c.ymin, c.ymax, len(c.XTicks), len(c.YTicks))
			}
			for _, p := range c.Paths {
				if strings.Contains(p.D, "NaN") || strings.Contains(p.D, "Inf") {
					t.Errorf("path %q draws a value that is not a number", p.D)
				}
			}
		})
	}
}
