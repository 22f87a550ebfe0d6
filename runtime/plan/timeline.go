package plan

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// timelineOrder is the stacking order of the timeline's categories, bottom
// first: the persistent state, then what each op brings and takes away.
var timelineOrder = []Kind{Params, Grads, Optimizer, Gathered, Activations, Logits, Comm, IO}

// KindColor is the colour of each category in the pictures, the same on
// every page so that a category is recognised at a glance.
var KindColor = map[Kind]string{
	Params:      "#4e79a7",
	Grads:       "#f28e2b",
	Optimizer:   "#e15759",
	Gathered:    "#76b7b2",
	Activations: "#59a14f",
	Logits:      "#edc948",
	Comm:        "#b07aa1",
	IO:          "#9c755f",
}

// otherColor colours a category the pictures do not know.
const otherColor = "#bab0ac"

// kindNote says in a few words what each category holds (docs/memory.md).
var kindNote = map[Kind]string{
	Params:      "sharded parameters",
	Grads:       "sharded fp32 grads, and a unit's unsharded grad in backward",
	Optimizer:   "AdamW first and second moments",
	Gathered:    "unsharded compute copies of FSDP units",
	Activations: "residual stream, activations, saved inputs, grad temporaries",
	Logits:      "one chunk of fp32 logits",
	Comm:        "collective buffers, host-device staging",
	IO:          "micro-batch inputs and per-token outputs",
}

// Timeline is a plan's device memory at every op of its timeline, by
// category: what `rlpipe plan --html` draws. Every figure is summed from
// the plan's device buffers (main arena and resident), as LiveBytes sums
// them, so the picture shows the plan and nothing else.
type Timeline struct {
	// Kinds are the categories that have bytes at some op, in stacking
	// order (bottom first).
	Kinds []Kind
	// Bytes[k][i] is the bytes of category Kinds[k] live at op i.
	Bytes [][]int64
	// Total[i] is the device bytes live at op i, the sum over Kinds.
	Total []int64
	// Peak is the largest Total, and PeakOp the first op that reaches it.
	Peak   int64
	PeakOp int
}

// Timeline sums the plan's device buffers at every op, by category.
func (p *Plan) Timeline() *Timeline {
	n := len(p.Ops)
	diff := map[Kind][]int64{}
	for _, b := range p.Buffers {
		if b.Host || b.Bytes == 0 || b.Start < 0 || b.End >= n || b.End < b.Start {
			continue
		}
		d := diff[b.Kind]
		if d == nil {
			d = make([]int64, n+1)
			diff[b.Kind] = d
		}
		d[b.Start] += b.Bytes
		d[b.End+1] -= b.Bytes
	}
	t := &Timeline{Total: make([]int64, n)}
	known := map[Kind]bool{}
	for _, k := range timelineOrder {
		known[k] = true
		if diff[k] != nil {
			t.Kinds = append(t.Kinds, k)
		}
	}
	var others []Kind
	for k := range diff {
		if !known[k] {
			others = append(others, k)
		}
	}
	sort.Slice(others, func(i, j int) bool { return others[i] < others[j] })
	t.Kinds = append(t.Kinds, others...)
	for _, k := range t.Kinds {
		row := make([]int64, n)
		var live int64
		for i := range n {
			live += diff[k][i]
			row[i] = live
			t.Total[i] += live
		}
		t.Bytes = append(t.Bytes, row)
	}
	for i, v := range t.Total {
		if v > t.Peak {
			t.Peak, t.PeakOp = v, i
		}
	}
	return t
}

//go:embed timeline.css
var timelineCSS string

//go:embed timeline.js
var timelineJS string

//go:embed timeline.tmpl
var timelineTmpl string

// templates are the timeline's section and its stand-alone page.
var templates = template.Must(template.New("timeline").Funcs(template.FuncMap{
	"css": func(s string) template.CSS { return template.CSS(s) },
	"js":  func(s string) template.JS { return template.JS(s) },
}).Parse(timelineTmpl))

// WriteTimeline writes the plan's memory timeline as one self-contained
// HTML page (inline SVG, style and script; nothing fetched): the device
// memory in use at every op, stacked by category, with the peak, the
// budget the GPU leaves the arena, and the setup and step phases marked.
func (p *Plan) WriteTimeline(w io.Writer, h Header) error {
	sec, err := p.TimelineSection(h)
	if err != nil {
		return err
	}
	return templates.ExecuteTemplate(w, "page", struct {
		Title   string
		Section template.HTML
	}{"rlpipe plan: " + h.Job, sec})
}

// TimelineSection returns the memory timeline as an HTML fragment, a
// <section> carrying its own style and script, for a page to embed once
// (the run report embeds its run's plan).
func (p *Plan) TimelineSection(h Header) (template.HTML, error) {
	v := p.timelineView(h)
	var b bytes.Buffer
	if err := templates.ExecuteTemplate(&b, "section", v); err != nil {
		return "", fmt.Errorf("timeline: %w", err)
	}
	return template.HTML(b.String()), nil
}

// The chart's geometry, in SVG user units.
const (
	tlWidth  = 1320.0
	tlLeft   = 74.0 // y tick labels
	tlRight  = 1300.0
	tlTop    = 34.0
	tlBottom = 420.0
	tlStageY = 426.0 // the stage strip
	tlStageH = 18.0
	tlPhaseY = 447.0 // the phase strip
	tlPhaseH = 14.0
	tlAxisY  = 476.0 // op tick labels
	tlHeight = 500.0
	tlCharW  = 6.3 // width of a character of the 11px labels, about
)

// tlGeom maps ops and bytes to the chart's coordinates.
type tlGeom struct {
	n    int
	ymax float64
}

// x is the left edge of op i (i = n is the right edge of the last op).
func (g tlGeom) x(i int) float64 { return tlLeft + (tlRight-tlLeft)*float64(i)/float64(max(g.n, 1)) }

// y is the height of b bytes.
func (g tlGeom) y(b int64) float64 { return tlBottom - (tlBottom-tlTop)*float64(b)/g.ymax }

// num formats a coordinate with one decimal, without a trailing ".0".
func num(v float64) string {
	s := strconv.FormatFloat(math.Round(v*10)/10, 'f', 1, 64)
	return strings.TrimSuffix(s, ".0")
}

// area is one category's band of the stacked chart.
type area struct {
	Kind  Kind
	Color string
	D     string // SVG path
}

// label is a piece of text placed on the chart.
type label struct {
	X, Y   string
	Anchor string
	Text   string
}

// band is a rectangle of a strip under the chart (a stage or a phase).
type band struct {
	X, W  string
	Class string
	Phase string
	Label *label
	Title string
}

// sleepMark is a sleep's vertical line at X, and its label.
type sleepMark struct {
	X     string
	Label label
}

// tick is an axis tick and its label.
type tick struct {
	Pos  string
	Text string
}

// legendItem is a category in the legend, with its bytes at the peak op.
type legendItem struct {
	Kind   Kind
	Color  string
	AtPeak string
	Note   string
}

// line is a horizontal line across the chart (the budget, the arena).
type line struct {
	Y     string
	Class string
	Label label
}

// timelineData is what the page's script reads: per-op names and bytes,
// for the tooltip and for its own check of the picture.
type timelineData struct {
	Ops       []string  `json:"ops"`
	Stage     []int     `json:"stage"` // index into Stages, per op
	Stages    []tlStage `json:"stages"`
	Kinds     []Kind    `json:"kinds"`
	Colors    []string  `json:"colors"`
	Bytes     [][]int64 `json:"bytes"`
	Total     []int64   `json:"total"`
	Peak      int64     `json:"peak"`
	PeakOp    int       `json:"peak_op"`
	Budget    int64     `json:"budget"`
	Unit      string    `json:"unit"`
	UnitBytes float64   `json:"unit_bytes"`
	// The chart's frame: ops span x0 to x1, bytes 0 to ymax span y1
	// (the bottom) to y0.
	X0     float64    `json:"x0"`
	X1     float64    `json:"x1"`
	Y0     float64    `json:"y0"`
	Y1     float64    `json:"y1"`
	YMax   float64    `json:"ymax"`
	Width  float64    `json:"width"`
	Sleeps []int      `json:"sleeps"`
	Header tlHeaderJS `json:"job"`
}

// tlStage is a stage as the page's script reads it.
type tlStage struct {
	ID    string `json:"id"`
	Kind  string `json:"kind"`
	Phase string `json:"phase"`
}

// tlHeaderJS is the job as the page's script reads it.
type tlHeaderJS struct {
	Name  string `json:"name"`
	Ranks int    `json:"ranks"`
}

// timelineView is what the section template draws.
type timelineView struct {
	CSS, JS string
	Title   string
	Facts   []string
	Figures [][2]string
	Legend  []legendItem
	Width   string
	Height  string
	Plot    tlFrame
	Areas   []area
	Lines   []line
	YTicks  []tick
	XTicks  []tick
	Stages  []band
	Phases  []band
	Sleeps  []sleepMark
	PeakX   string
	PeakY   string
	Peak    label
	Note    string
	Empty   bool
	Data    timelineData
}

// tlFrame is the chart's frame: the plot area (X, Y, W, H; right edge R,
// bottom B), the strips under it, and where the axes' labels go.
type tlFrame struct {
	X, Y, W, H, R, B string
	StageY, StageH   string
	PhaseY, PhaseH   string
	TickX            string // right edge of the y tick labels
	AxisY, NameY     string // baselines of the op tick labels and the axis name
}

func (p *Plan) timelineView(h Header) *timelineView {
	t := p.Timeline()
	n := len(p.Ops)
	u := unitFor(t.Peak)
	v := &timelineView{CSS: timelineCSS, JS: timelineJS, Title: "Memory timeline: " + h.Job, Empty: n == 0,
		Width: num(tlWidth), Height: num(tlHeight)}
	v.Plot = tlFrame{X: num(tlLeft), Y: num(tlTop), W: num(tlRight - tlLeft), H: num(tlBottom - tlTop), R: num(tlRight), B: num(tlBottom),
		StageY: num(tlStageY), StageH: num(tlStageH), PhaseY: num(tlPhaseY), PhaseH: num(tlPhaseH), TickX: num(tlLeft - 6), AxisY: num(tlAxisY), NameY: num(tlHeight - 6)}
	v.Facts = p.timelineFacts(h, t)
	budget := int64(0)
	if h.GPUBytes > 0 {
		budget = h.GPUBytes - p.ReserveBytes()
	}
	arena := p.DeviceArena + p.ResidentArena
	v.Figures = [][2]string{
		{"peak in use", fmt.Sprintf("%s %s", u.format(t.Peak), u.name)},
		{"arena", fmt.Sprintf("%s %s", u.format(arena), u.name)},
		{"reserves", fmt.Sprintf("%s %s", u.format(p.ReserveBytes()), u.name)},
		{"device total", fmt.Sprintf("%s %s of %s GiB", u.format(p.DeviceTotal()), u.name, GiB(h.GPUBytes))},
	}
	if p.HostArena > 0 {
		v.Figures = append(v.Figures, [2]string{"host pinned", fmt.Sprintf("%s %s per rank", u.format(p.HostArena), u.name)})
	}
	if h.GPUBytes > 0 {
		verdict := fmt.Sprintf("fits: %s GiB free per GPU", GiB(h.GPUBytes-p.DeviceTotal()))
		if !p.Fits(h.GPUBytes) {
			verdict = fmt.Sprintf("DOES NOT FIT: %s GiB over per GPU", GiB(p.DeviceTotal()-h.GPUBytes))
		}
		v.Figures = append(v.Figures, [2]string{"verdict", verdict})
	}
	// The scale: the peak, or the budget when it is near enough to show
	// both; the arena when it is above the peak.
	top := float64(max(t.Peak, arena, 1))
	if budget > 0 && float64(budget) <= 2*top {
		top = max(top, float64(budget))
	}
	g := tlGeom{n: n, ymax: top * 1.1}
	v.Data = timelineData{Kinds: t.Kinds, Bytes: t.Bytes, Total: t.Total, Peak: t.Peak, PeakOp: t.PeakOp, Budget: budget,
		Unit: u.name, UnitBytes: u.bytes, X0: tlLeft, X1: tlRight, Y0: tlTop, Y1: tlBottom, YMax: g.ymax, Width: tlWidth, Header: tlHeaderJS{h.Job, h.Ranks}, Sleeps: []int{}}
	stageIndex := map[string]int{}
	for i, s := range p.Stages {
		stageIndex[s.ID] = i
		v.Data.Stages = append(v.Data.Stages, tlStage{s.ID, s.Kind, s.Phase})
	}
	for _, op := range p.Ops {
		v.Data.Ops = append(v.Data.Ops, op.Name)
		v.Data.Stage = append(v.Data.Stage, stageIndex[op.Stage])
	}
	if v.Empty {
		return v
	}
	lower := make([]int64, n)
	for k, kind := range t.Kinds {
		upper := make([]int64, n)
		for i := range n {
			upper[i] = lower[i] + t.Bytes[k][i]
		}
		c := kindColor(kind)
		v.Data.Colors = append(v.Data.Colors, c)
		v.Areas = append(v.Areas, area{Kind: kind, Color: c, D: stepArea(g, lower, upper)})
		v.Legend = append(v.Legend, legendItem{Kind: kind, Color: c, AtPeak: Bytes(t.Bytes[k][t.PeakOp]), Note: kindNote[kind]})
		lower = upper
	}
	v.YTicks = byteTicks(g, u)
	v.XTicks = opTicks(g)
	v.Stages, v.Phases = p.strips(g)
	for _, s := range p.Sleeps {
		v.Data.Sleeps = append(v.Data.Sleeps, s.Op)
		x := g.x(s.Op + 1)
		v.Sleeps = append(v.Sleeps, sleepMark{X: num(x), Label: placeLabel(x, tlTop-3, fmt.Sprintf("sleep after op %d", s.Op))})
	}
	// The peak: a mark on the top of the stack at the peak op, labelled.
	px, py := (g.x(t.PeakOp)+g.x(t.PeakOp+1))/2, g.y(t.Peak)
	v.PeakX, v.PeakY = num(px), num(py)
	peakText := fmt.Sprintf("peak %s at op %d, %s (%s)", Bytes(t.Peak), t.PeakOp, p.Ops[t.PeakOp].Name, p.Ops[t.PeakOp].Stage)
	v.Peak = placeLabel(px, py-9, peakText)
	if arena > t.Peak {
		ay := g.y(arena)
		text := fmt.Sprintf("arena %s: above the peak, for the gaps best-fit offsets leave", Bytes(arena))
		if p.ResidentArena > 0 {
			text = fmt.Sprintf("arenas %s: main %s + resident %s", Bytes(arena), Bytes(p.DeviceArena), Bytes(p.ResidentArena))
		}
		v.Lines = append(v.Lines, line{Y: num(ay), Class: "arena", Label: label{X: num(tlLeft + 6), Y: num(ay - 4), Anchor: "start", Text: text}})
	}
	if budget > 0 {
		budgetText := fmt.Sprintf("budget %s GiB: GPU %s GiB less reserves %s GiB", GiB(budget), GiB(h.GPUBytes), GiB(p.ReserveBytes()))
		if float64(budget) <= g.ymax {
			by := g.y(budget)
			l := label{X: num(tlLeft + 6), Y: num(by - 5), Anchor: "start", Text: budgetText}
			// Keep the budget's label off the peak's.
			if math.Abs(by-5-(py-9)) < 16 && px < tlLeft+6+textWidth(budgetText)+textWidth(peakText)/2+20 {
				l = label{X: num(tlRight - 6), Y: num(by - 5), Anchor: "end", Text: budgetText}
				if px > tlLeft+(tlRight-tlLeft)/2 {
					l.Y = num(by + 14)
				}
			}
			v.Lines = append(v.Lines, line{Y: num(by), Class: "budget", Label: l})
		} else {
			v.Note = fmt.Sprintf("%s: above the scale (the peak uses %s%% of it)", budgetText, percent(t.Peak, budget))
		}
	}
	return v
}

// timelineFacts are the lines under the page's title: the job, its mesh
// and what the x axis is.
func (p *Plan) timelineFacts(h Header, t *Timeline) []string {
	var facts []string
	job := h.Job
	if job == "" {
		job = "job"
	}
	mesh := fmt.Sprintf("%s: %d rank(s), dp %d", job, max(h.Ranks, 1), max(h.DP, 1))
	if h.CP > 1 {
		mesh += fmt.Sprintf(" × cp %d", h.CP)
	}
	if h.Tokens > 0 {
		mesh += fmt.Sprintf(", %d tokens per micro-batch per GPU", h.Tokens)
	}
	if h.Updates > 0 {
		mesh += fmt.Sprintf(", %d optimizer update(s) per step (the plan holds one, reused)", h.Updates)
	}
	facts = append(facts, mesh)
	if h.GPUName != "" || h.GPUBytes > 0 {
		src := ""
		if h.GPUSource != "" {
			src = " (" + h.GPUSource + ")"
		}
		facts = append(facts, fmt.Sprintf("GPU: %s, %s GiB%s", h.GPUName, GiB(h.GPUBytes), src))
	}
	if h.Ranks > 1 {
		facts = append(facts, fmt.Sprintf("Every one of the %d ranks has this plan: shards are sized for the largest rank.", h.Ranks))
	}
	var phases []string
	for _, s := range mergePhases(p.Stages) {
		phases = append(phases, fmt.Sprintf("%s ops %d–%d", s.Phase, s.First, s.Last))
	}
	facts = append(facts, fmt.Sprintf("x: the %d ops of the timeline, one micro-batch and one optimizer update of a step (%s); y: device bytes live at each op, stacked by category. The top of the stack is the plan's live bytes at that op.", len(p.Ops), strings.Join(phases, ", ")))
	return facts
}

// kindColor returns the colour of category k.
func kindColor(k Kind) string {
	if c, ok := KindColor[k]; ok {
		return c
	}
	return otherColor
}

// stepArea returns the SVG path of the band between lower and upper, drawn
// as steps: op i spans [x(i), x(i+1)].
func stepArea(g tlGeom, lower, upper []int64) string {
	var b strings.Builder
	n := len(upper)
	fmt.Fprintf(&b, "M%s %sV%s", num(g.x(0)), num(g.y(lower[0])), num(g.y(upper[0])))
	for i := range n {
		if i > 0 && upper[i] != upper[i-1] {
			fmt.Fprintf(&b, "V%s", num(g.y(upper[i])))
		}
		if i == n-1 || upper[i+1] != upper[i] {
			fmt.Fprintf(&b, "H%s", num(g.x(i+1)))
		}
	}
	fmt.Fprintf(&b, "V%s", num(g.y(lower[n-1])))
	for i := n - 1; i >= 0; i-- {
		if i < n-1 && lower[i] != lower[i+1] {
			fmt.Fprintf(&b, "V%s", num(g.y(lower[i])))
		}
		if i == 0 || lower[i-1] != lower[i] {
			fmt.Fprintf(&b, "H%s", num(g.x(i)))
		}
	}
	b.WriteString("Z")
	return b.String()
}

// niceStep returns a round step (1, 2 or 5 times a power of ten) that
// cuts span into about n parts.
func niceStep(span float64, n int) float64 {
	if span <= 0 {
		return 1
	}
	raw := span / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

// byteTicks returns the y ticks in the unit u.
func byteTicks(g tlGeom, u unit) []tick {
	top := g.ymax / u.bytes
	step := niceStep(top, 6)
	var ts []tick
	for v := 0.0; v <= top+1e-9; v += step {
		ts = append(ts, tick{Pos: num(g.y(int64(math.Round(v * u.bytes)))), Text: strconv.FormatFloat(v, 'f', -1, 64) + " " + u.name})
	}
	return ts
}

// opTicks returns the x ticks at round op indices.
func opTicks(g tlGeom) []tick {
	step := max(1, int(niceStep(float64(g.n), 10)))
	var ts []tick
	for i := 0; i < g.n; i += step {
		ts = append(ts, tick{Pos: num((g.x(i) + g.x(i+1)) / 2), Text: strconv.Itoa(i)})
	}
	return ts
}

// Bytes formats n bytes for a reader: in GiB, MiB or KiB with two
// decimals, whichever is the largest below n, or in bytes.
func Bytes(n int64) string {
	for _, u := range []unit{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if math.Abs(float64(n)) >= u.bytes {
			return fmt.Sprintf("%.2f %s", float64(n)/u.bytes, u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}

// percent formats 100·n/of with two significant digits, at most one
// decimal above 1%.
func percent(n, of int64) string {
	v := 100 * float64(n) / float64(of)
	if v >= 1 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'g', 2, 64)
}

// textWidth is about the width of text in the chart's 11px labels.
func textWidth(text string) float64 { return tlCharW * float64(utf8.RuneCountInString(text)) }

// placeLabel anchors text at x so that it stays inside the chart.
func placeLabel(x, y float64, text string) label {
	w := textWidth(text)
	switch {
	case x-w/2 < tlLeft+2:
		return label{X: num(max(x-8, tlLeft+2)), Y: num(y), Anchor: "start", Text: text}
	case x+w/2 > tlRight-2:
		return label{X: num(min(x+8, tlRight-2)), Y: num(y), Anchor: "end", Text: text}
	}
	return label{X: num(x), Y: num(y), Anchor: "middle", Text: text}
}

// mergePhases returns the runs of consecutive stages of one phase, as
// spans of ops.
func mergePhases(stages []StageSpan) []StageSpan {
	var out []StageSpan
	for _, s := range stages {
		if s.Last < s.First {
			continue
		}
		if len(out) > 0 && out[len(out)-1].Phase == s.Phase {
			out[len(out)-1].Last = s.Last
			continue
		}
		out = append(out, StageSpan{Phase: s.Phase, First: s.First, Last: s.Last})
	}
	return out
}

// strips returns the bands of the stage and phase strips under the chart,
// each labelled where its label fits.
func (p *Plan) strips(g tlGeom) (stages, phases []band) {
	fit := func(x0, x1, y float64, text string) *label {
		if x1-x0 < textWidth(text)+6 {
			return nil
		}
		return &label{X: num((x0 + x1) / 2), Y: num(y), Anchor: "middle", Text: text}
	}
	for i, s := range p.Stages {
		if s.Last < s.First {
			continue
		}
		x0, x1 := g.x(s.First), g.x(s.Last+1)
		stages = append(stages, band{X: num(x0), W: num(x1 - x0), Class: fmt.Sprintf("stage s%d", i%2),
			Label: fit(x0, x1, tlStageY+tlStageH-5, s.ID), Title: fmt.Sprintf("%s (%s, %s): ops %d–%d", s.ID, s.Kind, s.Phase, s.First, s.Last)})
	}
	for _, s := range mergePhases(p.Stages) {
		x0, x1 := g.x(s.First), g.x(s.Last+1)
		l := fit(x0, x1, tlPhaseY+tlPhaseH-3, s.Phase)
		if l == nil {
			// Too narrow for its name: name it beside the band, over
			// the next phase's start, where that phase's centred name
			// is not.
			text := fmt.Sprintf("◂ %s (ops %d–%d)", s.Phase, s.First, s.Last)
			l = &label{X: num(x1 + 4), Y: num(tlPhaseY + tlPhaseH - 3), Anchor: "start", Text: text}
			if x1+4+textWidth(text) > tlRight {
				l.X, l.Anchor, l.Text = num(x0-4), "end", fmt.Sprintf("%s (ops %d–%d) ▸", s.Phase, s.First, s.Last)
			}
		}
		phases = append(phases, band{X: num(x0), W: num(x1 - x0), Class: "phase " + s.Phase, Phase: s.Phase,
			Label: l, Title: fmt.Sprintf("%s: ops %d–%d", s.Phase, s.First, s.Last)})
	}
	return stages, phases
}
