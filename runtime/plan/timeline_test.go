package plan_test

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
)

// loadExample plans examples/NAME.yaml for the GPU of its mesh.gpu (an
// H100 where it names none), as rlpipe plan does.
func loadExample(t *testing.T, name string) (*plan.Plan, plan.Header) {
	t.Helper()
	s, err := spec.Load(filepath.Join("..", "..", "examples", name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	preset := s.Mesh.GPU
	if preset == "" {
		preset = "h100-80g"
	}
	gname, gbytes, err := gpu.ParseGPU(preset)
	if err != nil {
		t.Fatal(err)
	}
	j, err := stages.Resolve(s, stages.GPU{Name: gname, Bytes: gbytes, Source: "test"}, stages.CheckPlan)
	if err != nil {
		t.Fatal(err)
	}
	p, err := stages.Plan(j)
	if err != nil {
		t.Fatal(err)
	}
	return p, plan.Header{Job: s.Name, GPUName: gname, GPUBytes: gbytes, GPUSource: "test", Ranks: s.Mesh.WorldSize(),
		DP: s.Mesh.DP, CP: s.Mesh.CP, Updates: s.UpdatesPerStep(), RanksPerHost: s.Mesh.GPUsPerNode}
}

// pageData is what the test reads of the page's embedded data: the
// totals it drew and the frame it drew them in.
type pageData struct {
	Total          []int64
	Peak           int64
	PeakOp         int `json:"peak_op"`
	X0, X1, Y0, Y1 float64
	YMax           float64
}

var (
	dataRE = regexp.MustCompile(`(?s)<script type="application/json" class="rlp-data">(.*?)</script>`)
	areaRE = regexp.MustCompile(`<path class="rlp-area" data-kind="([^"]*)" fill="[^"]*" d="([^"]*)"`)
	peakRE = regexp.MustCompile(`class="peak rlp-peak-label"[^>]*>([^<]*)<`)
	// unfitRE finds what a self-contained page must not have: a
	// reference to fetch, or html/template's mark of a refused value.
	unfitRE = regexp.MustCompile(`https?://|<link|\ssrc=|@import|url\(|ZgotmplZ`)
)

// stackTops returns, for every op, the y of the top of the stack the
// areas' paths draw: the smallest y of a horizontal edge over the op's
// middle.
func stackTops(t *testing.T, paths []string, d pageData) []float64 {
	t.Helper()
	n := len(d.Total)
	tops := make([]float64, n)
	for i := range tops {
		tops[i] = math.Inf(1)
	}
	mid := func(i int) float64 { return d.X0 + (d.X1-d.X0)*(float64(i)+0.5)/float64(n) }
	for _, path := range paths {
		var x, y float64
		for _, cmd := range regexp.MustCompile(`[MHVZ][^MHVZ]*`).FindAllString(path, -1) {
			args := strings.Fields(cmd[1:])
			num := func(k int) float64 {
				v, err := strconv.ParseFloat(args[k], 64)
				if err != nil {
					t.Fatalf("path command %q: %v", cmd, err)
				}
				return v
			}
			switch cmd[0] {
			case 'M':
				x, y = num(0), num(1)
			case 'V':
				y = num(0)
			case 'H':
				nx := num(0)
				for i := range n {
					if m := mid(i); min(x, nx) < m && m < max(x, nx) {
						tops[i] = min(tops[i], y)
					}
				}
				x = nx
			}
		}
	}
	return tops
}

// TestTimelineIsThePlan checks, on the examples, that the timeline is the
// plan: at every op the categories add up to the plan's live bytes, the
// peak is the plan's peak, and the page draws exactly those figures.
func TestTimelineIsThePlan(t *testing.T) {
	tests := []struct {
		example string
		unit    string
	}{
		{"tiny-grpo", "MiB"},
		{"tiny-colocated", "MiB"}, // a sleep, and resident buffers
		{"tiny-cp2", "MiB"},       // its arena is larger than its peak
		{"qwen2.5-0.5b-grpo-1gpu", "GiB"},
		{"llama-3.1-8b-offload-8gpu", "GiB"}, // 8 ranks, offloaded state
	}
	for _, tt := range tests {
		t.Run(tt.example, func(t *testing.T) {
			p, h := loadExample(t, tt.example)
			tl := p.Timeline()
			if len(tl.Total) != len(p.Ops) {
				t.Fatalf("%d totals for %d ops", len(tl.Total), len(p.Ops))
			}
			for i := range p.Ops {
				live, by := p.LiveBytes(i, false)
				if tl.Total[i] != live {
					t.Fatalf("op %d: timeline total %d, plan live bytes %d", i, tl.Total[i], live)
				}
				for k, kind := range tl.Kinds {
					if tl.Bytes[k][i] != by[kind] {
						t.Fatalf("op %d: %s %d, plan %d", i, kind, tl.Bytes[k][i], by[kind])
					}
				}
			}
			if tl.Peak != p.PeakBytes {
				t.Errorf("timeline peak %d, plan peak %d", tl.Peak, p.PeakBytes)
			}
			if s := p.Ops[tl.PeakOp].Stage; s != p.PeakStage {
				t.Errorf("peak op %d is in stage %s, the plan's peak stage is %s", tl.PeakOp, s, p.PeakStage)
			}

			var page bytes.Buffer
			if err := p.WriteTimeline(&page, h); err != nil {
				t.Fatal(err)
			}
			html := page.String()
			if dir := os.Getenv("RLPIPE_SCREENSHOTS"); dir != "" {
				if err := os.WriteFile(filepath.Join(dir, tt.example+"-timeline.html"), page.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if bad := unfitRE.FindString(html); bad != "" {
				t.Errorf("the page has %q: it fetches something, or a value html/template refused", bad)
			}
			var d pageData
			if m := dataRE.FindStringSubmatch(html); m == nil || json.Unmarshal([]byte(m[1]), &d) != nil {
				t.Fatal("no embedded data, or not JSON")
			}
			if d.Peak != p.PeakBytes || d.PeakOp != tl.PeakOp {
				t.Errorf("page peak %d at op %d, plan %d at op %d", d.Peak, d.PeakOp, p.PeakBytes, tl.PeakOp)
			}
			for i, total := range d.Total {
				if live, _ := p.LiveBytes(i, false); total != live {
					t.Fatalf("page total at op %d is %d, plan %d", i, total, live)
				}
			}
			areas := areaRE.FindAllStringSubmatch(html, -1)
			if len(areas) != len(tl.Kinds) {
				t.Fatalf("%d areas for %d categories", len(areas), len(tl.Kinds))
			}
			var paths []string
			for k, a := range areas {
				if a[1] != string(tl.Kinds[k]) {
					t.Errorf("area %d is %s, want %s", k, a[1], tl.Kinds[k])
				}
				paths = append(paths, a[2])
			}
			// The drawn top of the stack is the plan's live bytes, to
			// the 0.1 unit the coordinates are written with.
			for i, top := range stackTops(t, paths, d) {
				live, _ := p.LiveBytes(i, false)
				want := d.Y1 - (d.Y1-d.Y0)*float64(live)/d.YMax
				if math.Abs(top-want) > 0.051 {
					t.Fatalf("op %d: the stack's top is drawn at y %.2f, the plan's %d bytes are at %.2f", i, top, live, want)
				}
			}
			peak := peakRE.FindStringSubmatch(html)
			if peak == nil {
				t.Fatal("no peak label")
			}
			op := p.Ops[tl.PeakOp]
			for _, want := range []string{"peak " + plan.Bytes(p.PeakBytes) + " ", "op " + strconv.Itoa(tl.PeakOp), op.Name, op.Stage, tt.unit} {
				if !strings.Contains(peak[1], want) {
					t.Errorf("peak label %q lacks %q", peak[1], want)
				}
			}
		})
	}
}

// TestTimelineEdges draws plans the examples do not make: no op, a
// category the picture does not know, a budget far above the peak, and
// one the plan does not fit.
func TestTimelineEdges(t *testing.T) {
	build := func(f func(b *plan.Builder)) *plan.Plan {
		b := plan.NewBuilder()
		f(b)
		p, err := b.Finish()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name  string
		plan  *plan.Plan
		gpu   int64
		want  []string
		kinds int
	}{
		{"no ops", build(func(*plan.Builder) {}), 1 << 30, []string{"The plan has no ops"}, 0},
		{"unknown category", build(func(b *plan.Builder) {
			b.BeginStage("s", "k", "step")
			i := b.Op("one")
			b.Alloc("x", plan.Kind("scratch"), 1<<20, i, i)
			b.Alloc("y", plan.Activations, 1<<20, i, b.Op("two"))
		}), 1 << 30, []string{`data-kind="scratch"`, "peak 2.00 MiB at op 0, one (s)", "above the scale"}, 2},
		{"does not fit", build(func(b *plan.Builder) {
			b.BeginStage("setup", "load", "setup")
			b.Persistent("p", plan.Params, 3<<20, false, b.Op("load"))
			b.BeginStage("train", "train", "step")
			i := b.Op("fwd")
			b.Alloc("a", plan.Activations, 2<<20, i, b.Op("bwd"))
		}), 4 << 20, []string{"DOES NOT FIT", `class="budget"`, "peak 5.00 MiB at op 1, fwd (train)"}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var page bytes.Buffer
			if err := tt.plan.WriteTimeline(&page, plan.Header{Job: "edge", GPUName: "g", GPUBytes: tt.gpu, Ranks: 1, DP: 1}); err != nil {
				t.Fatal(err)
			}
			html := page.String()
			for _, w := range tt.want {
				if !strings.Contains(html, w) {
					t.Errorf("the page lacks %q", w)
				}
			}
			if got := len(areaRE.FindAllString(html, -1)); got != tt.kinds {
				t.Errorf("%d areas, want %d", got, tt.kinds)
			}
		})
	}
}
