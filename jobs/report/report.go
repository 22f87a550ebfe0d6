// Package report writes the report of a run record as one self-contained
// HTML page (`rlpipe jobs report`): the run's header, its training curves
// drawn as inline SVG, and its planned against its measured memory, with
// the plan's memory timeline. The page fetches nothing: its style, its
// pictures and its small script are all in the file.
package report

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/rlpipe/rlpipe/jobs"
	"github.com/rlpipe/rlpipe/runtime/plan"
)

// FileName is the name of the report in a run directory, where `rlpipe
// jobs report` writes it unless told otherwise.
const FileName = "report.html"

// NVMLKey is the metrics key of the device memory NVML measured for the
// process of rank 0 at the end of a step, recorded on CUDA runs.
const NVMLKey = "nvml_bytes"

// Report is what the page shows of one run record.
type Report struct {
	Meta jobs.Meta
	Dir  string
	// Backend is the backend the run last ran on ("cpu", "cuda"), from
	// the run log; "" when the record does not say.
	Backend string
	// Steps and Updates are the lines of metrics.jsonl and updates.jsonl.
	Steps, Updates []jobs.Metrics
	// Plan is the record's memory plan, nil without a readable plan.json,
	// and Header what resolved.json says of the GPU and the mesh.
	Plan   *plan.Plan
	Header plan.Header
	// Warnings are what could not be read, said on the page.
	Warnings []string
	// Generated is when the report was made.
	Generated time.Time
}

// Load reads what the report shows from the run record r. Only the
// metrics are required: a missing or damaged plan, resolved spec or log
// becomes a warning on the page.
func Load(r *jobs.Run) (*Report, error) {
	rep := &Report{Meta: r.Meta(), Dir: r.Dir(), Generated: time.Now()}
	var err error
	rep.Steps, err = r.Metrics()
	if errors.Is(err, jobs.ErrTruncatedMetrics) {
		rep.Warnings = append(rep.Warnings, err.Error())
	} else if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	rep.Updates, err = r.Updates()
	if errors.Is(err, jobs.ErrTruncatedMetrics) {
		rep.Warnings = append(rep.Warnings, err.Error())
	} else if err != nil {
		rep.Warnings = append(rep.Warnings, err.Error())
		rep.Updates = nil
	}
	rep.Header.Job = rep.Meta.Name
	if data, err := r.ReadFile(jobs.ResolvedFile); err == nil {
		if err := rep.readResolved(data); err != nil {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s: %v", jobs.ResolvedFile, err))
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		rep.Warnings = append(rep.Warnings, err.Error())
	}
	if data, err := r.ReadFile(jobs.PlanFile); err == nil {
		var p plan.Plan
		if err := json.Unmarshal(data, &p); err != nil {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s: %v", jobs.PlanFile, err))
		} else {
			rep.Plan = &p
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		rep.Warnings = append(rep.Warnings, err.Error())
	}
	if data, err := r.ReadFile(jobs.LogFileName); err == nil {
		rep.Backend = backendOf(data)
	}
	return rep, nil
}

// readResolved takes the GPU and the mesh from resolved.json.
func (rep *Report) readResolved(data []byte) error {
	var res struct {
		Name string
		GPU  struct {
			Name   string
			Bytes  int64
			Source string
		}
		Mesh struct {
			Nodes, GPUsPerNode, DP, CP int
		}
		UpdatesPerStep int
	}
	if err := json.Unmarshal(data, &res); err != nil {
		return err
	}
	h := &rep.Header
	if res.Name != "" {
		h.Job = res.Name
	}
	h.GPUName, h.GPUBytes, h.GPUSource = res.GPU.Name, res.GPU.Bytes, res.GPU.Source
	h.Ranks, h.DP, h.CP = res.Mesh.Nodes*res.Mesh.GPUsPerNode, res.Mesh.DP, res.Mesh.CP
	h.RanksPerHost, h.Updates = res.Mesh.GPUsPerNode, res.UpdatesPerStep
	return nil
}

// backendOf returns the backend of the last "run started" line of a run
// log (zerolog JSON lines), or "".
func backendOf(log []byte) string {
	backend := ""
	for _, line := range strings.Split(string(log), "\n") {
		var l struct {
			Message string `json:"message"`
			Backend string `json:"backend"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Message == "run started" && l.Backend != "" {
			backend = l.Backend
		}
	}
	return backend
}

// Measured reports whether any step recorded NVML's device memory.
func (rep *Report) Measured() bool {
	for _, m := range rep.Steps {
		if _, ok := m.Extra[NVMLKey]; ok {
			return true
		}
	}
	return false
}

// Write reads the run record r and writes its report to w.
func Write(w io.Writer, r *jobs.Run) error {
	rep, err := Load(r)
	if err != nil {
		return err
	}
	return rep.WriteHTML(w)
}

// files are the page's template, style and script.
//
//go:embed report.tmpl report.css report.js
var files embed.FS

// page is the report's template, and style and script what it inlines.
var (
	page   = template.Must(template.ParseFS(files, "report.tmpl"))
	style  = template.CSS(must(files.ReadFile("report.css")))
	script = template.JS(must(files.ReadFile("report.js")))
)

// must returns the contents of an embedded file, which cannot be missing.
func must(b []byte, err error) string {
	if err != nil {
		panic(err)
	}
	return string(b)
}

// view is what the page template draws.
type view struct {
	CSS      template.CSS
	JS       template.JS
	Title    string
	Header   [][2]string
	Status   string
	Error    string
	Warnings []string
	Charts   []*chart
	Missing  []string // curves the record has no values for
	Memory   memoryView
	Timeline template.HTML
	Device   *deviceView // nil without a step's timeline
	Data     pageData
	NoSteps  bool
}

// pageData is what the page's script reads: the charts' points, for the
// tooltips and for its count of what it drew.
type pageData struct {
	Charts []chartData `json:"charts"`
}

// WriteHTML writes the report as one self-contained HTML page.
func (rep *Report) WriteHTML(w io.Writer) error {
	m := rep.Meta
	v := &view{CSS: style, JS: script, Title: fmt.Sprintf("rlpipe run %s: %s", short(m.ID), m.Name), Status: string(m.Status), Error: m.Error,
		Warnings: rep.Warnings, NoSteps: len(rep.Steps) == 0}
	v.Header = rep.header()
	v.Charts, v.Missing = rep.curves()
	v.Memory = rep.memory()
	v.Charts = append(v.Charts, v.Memory.Charts...)
	for _, c := range v.Charts {
		v.Data.Charts = append(v.Data.Charts, c.data())
	}
	if v.Data.Charts == nil {
		v.Data.Charts = []chartData{}
	}
	if rep.Plan != nil && len(rep.Plan.Ops) > 0 {
		sec, err := rep.Plan.TimelineSection(rep.Header)
		if err != nil {
			return err
		}
		v.Timeline = sec
	}
	dv, err := rep.device()
	if err != nil {
		v.Warnings = append(v.Warnings, fmt.Sprintf("device time: %v", err))
	}
	v.Device = dv
	if err := page.Execute(w, v); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// short is the 8-character form of a run id.
func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// header returns the rows of the run's header.
func (rep *Report) header() [][2]string {
	m := rep.Meta
	backend := rep.Backend
	switch {
	case backend == "" && rep.Measured():
		backend = "cuda (the record has NVML figures)"
	case backend == "":
		backend = "unknown (the run log does not say)"
	}
	rows := [][2]string{
		{"run", m.ID},
		{"name", m.Name},
		{"spec", m.SpecPath},
		{"status", string(m.Status)},
		{"steps", fmt.Sprintf("%d of %d", m.LastStep, m.TotalSteps)},
		{"backend", backend},
	}
	if h := rep.Header; h.Ranks > 0 {
		mesh := fmt.Sprintf("%d rank(s), dp %d", h.Ranks, max(h.DP, 1))
		if h.CP > 1 {
			mesh += fmt.Sprintf(" × cp %d", h.CP)
		}
		rows = append(rows, [2]string{"mesh", mesh})
	}
	if h := rep.Header; h.GPUName != "" {
		rows = append(rows, [2]string{"GPU", fmt.Sprintf("%s, %s GiB (%s)", h.GPUName, plan.GiB(h.GPUBytes), h.GPUSource)})
	}
	var updates int
	var tokens int64
	var wall float64
	for _, s := range rep.Steps {
		updates += s.Updates
		tokens += s.Tokens
		wall += s.WallS
	}
	if len(rep.Steps) > 0 {
		rows = append(rows, [2]string{"trained", fmt.Sprintf("%d step line(s), %d update(s), %d tokens in %.1f s of steps", len(rep.Steps), updates, tokens, wall)})
	}
	rows = append(rows, [2]string{"seed", fmt.Sprint(m.Seed)})
	if !m.Created.IsZero() {
		rows = append(rows, [2]string{"created", m.Created.Local().Format(time.RFC3339)})
	}
	if !m.Finished.IsZero() {
		rows = append(rows, [2]string{"finished", fmt.Sprintf("%s (%s after it was created)", m.Finished.Local().Format(time.RFC3339), m.Finished.Sub(m.Created).Round(time.Second))})
	}
	if m.Resumes > 0 {
		rows = append(rows, [2]string{"resumed", fmt.Sprintf("%d time(s)", m.Resumes)})
	}
	if m.Exported != "" {
		rows = append(rows, [2]string{"export", fmt.Sprintf("%s (step %d)", m.Exported, m.ExportedStep)})
	}
	if m.Host != "" || m.Version != "" {
		rows = append(rows, [2]string{"host", fmt.Sprintf("%s, rlpipe %s", m.Host, m.Version)})
	}
	rows = append(rows, [2]string{"record", rep.Dir})
	return rows
}

// metric is one training curve: how to read it from a metrics line, and
// whether the update lines hold it (or only the step lines).
type metric struct {
	key       string
	perUpdate bool
	get       func(m jobs.Metrics) (float64, bool)
}

// field reads a fixed field of every line.
func field(f func(m jobs.Metrics) float64) func(jobs.Metrics) (float64, bool) {
	return func(m jobs.Metrics) (float64, bool) { return f(m), true }
}

// extra reads an extra value, present only on the lines that have it.
func extra(key string) func(jobs.Metrics) (float64, bool) {
	return func(m jobs.Metrics) (float64, bool) {
		v, ok := m.Extra[key]
		return v, ok
	}
}

// charts are the training curves, in page order; a chart may draw
// several metrics.
var charts = []struct {
	title, note string
	metrics     []metric
}{
	{"loss", "the loss the optimizer minimised, and its policy-gradient term", []metric{
		{key: "loss", perUpdate: true, get: field(func(m jobs.Metrics) float64 { return m.Loss })},
		{key: "pg_loss", perUpdate: true, get: field(func(m jobs.Metrics) float64 { return m.PGLoss })},
	}},
	{"reward", "mean reward of the step's fresh rollouts (a generate stage)", []metric{
		{key: "reward_mean", get: extra("reward_mean")},
	}},
	{"reward-weighted objective", "adv_logp: Σ Â·mean log π over the update's samples; it rises as the policy prefers the better responses", []metric{
		{key: "adv_logp", perUpdate: true, get: extra("adv_logp")},
	}},
	{"KL", "the KL term to the reference model", []metric{
		{key: "kl", perUpdate: true, get: field(func(m jobs.Metrics) float64 { return m.KL })},
	}},
	{"entropy", "mean token entropy of the policy", []metric{
		{key: "entropy", perUpdate: true, get: field(func(m jobs.Metrics) float64 { return m.Entropy })},
	}},
	{"clipfrac", "fraction of tokens whose ratio was clipped", []metric{
		{key: "clipfrac", perUpdate: true, get: field(func(m jobs.Metrics) float64 { return m.ClipFrac })},
	}},
	{"grad norm", "global gradient norm before clipping", []metric{
		{key: "grad_norm", perUpdate: true, get: field(func(m jobs.Metrics) float64 { return m.GradNorm })},
	}},
	{"learning rate", "", []metric{
		{key: "lr", perUpdate: true, get: field(func(m jobs.Metrics) float64 { return m.LR })},
	}},
	{"tokens/s", "the step's tokens over its wall time", []metric{
		{key: "tokens_per_s", get: field(func(m jobs.Metrics) float64 { return m.TokensPerS })},
	}},
}

// seriesColors colour the series of a chart, in order.
var seriesColors = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"}

// curves returns the training charts, and the titles of those the record
// has no values for.
func (rep *Report) curves() (out []*chart, missing []string) {
	if len(rep.Steps) == 0 {
		return nil, nil
	}
	upd := updatePoints(rep.Updates)
	for _, c := range charts {
		ch := &chart{ID: fmt.Sprintf("c%d", len(out)), Title: c.title, Note: c.note, Format: "num"}
		sources := map[string]bool{}
		for _, m := range c.metrics {
			var pts []point
			src := jobs.MetricsFile
			if m.perUpdate && len(rep.Updates) > 0 {
				src = jobs.UpdatesFile
				for i, u := range rep.Updates {
					if v, ok := m.get(u); ok {
						pts = append(pts, point{X: upd[i], Y: v, Step: u.Step, Update: u.Update})
					}
				}
			} else {
				for _, s := range rep.Steps {
					if v, ok := m.get(s); ok {
						pts = append(pts, point{X: float64(s.Step), Y: v, Step: s.Step})
					}
				}
			}
			if len(pts) == 0 {
				continue
			}
			sources[src] = true
			ch.Series = append(ch.Series, series{Name: m.key, Color: seriesColors[len(ch.Series)%len(seriesColors)], Points: pts})
		}
		if len(ch.Series) == 0 {
			missing = append(missing, c.title)
			continue
		}
		switch {
		case sources[jobs.UpdatesFile] && sources[jobs.MetricsFile]:
			ch.Source = "per update and per step"
		case sources[jobs.UpdatesFile]:
			ch.Source = "per optimizer update (updates.jsonl)"
		default:
			ch.Source = "per step (metrics.jsonl)"
		}
		out = append(out, ch)
	}
	return out, missing
}

// updatePoints places the updates on the step axis: the n updates of
// step s at s-1+1/n, ..., s, so that a step's last update lines up with
// the step.
func updatePoints(us []jobs.Metrics) []float64 {
	count := map[int]int{}
	for _, u := range us {
		count[u.Step]++
	}
	seen := map[int]int{}
	xs := make([]float64, len(us))
	for i, u := range us {
		seen[u.Step]++
		xs[i] = float64(u.Step-1) + float64(seen[u.Step])/float64(count[u.Step])
	}
	return xs
}

// memoryView is the page's memory section.
type memoryView struct {
	Rows     []memoryRow
	Notes    []string
	Charts   []*chart
	Measured bool
	HasPlan  bool
}

// memoryRow is one planned figure beside its measurement.
type memoryRow struct {
	What, Planned, Measured, Diff, Class string
}

// memory compares the plan with what the run measured: the arena's
// high-water mark (every backend) and NVML's device memory (CUDA).
func (rep *Report) memory() memoryView {
	mv := memoryView{HasPlan: rep.Plan != nil, Measured: rep.Measured()}
	var hw int64
	var nvml, asleep, asleepPlan float64
	nvmlSteps, asleepSteps := 0, 0
	for _, s := range rep.Steps {
		hw = max(hw, s.PeakMemBytes)
		if v, ok := s.Extra[NVMLKey]; ok {
			nvml = math.Max(nvml, v)
			nvmlSteps++
		}
		if v, ok := s.Extra["asleep_device_bytes"]; ok {
			asleep = math.Max(asleep, v)
			asleepSteps++
		}
		if v, ok := s.Extra["asleep_plan_bytes"]; ok {
			asleepPlan = math.Max(asleepPlan, v)
		}
	}
	var peak, total int64
	planned := func(n int64) string { return "no plan in the record" }
	if p := rep.Plan; p != nil {
		peak, total = p.PeakBytes, p.DeviceTotal()
		planned = plan.Bytes
	}
	row := memoryRow{What: "arena bytes in use, high-water mark (per rank)", Planned: planned(peak)}
	switch {
	case len(rep.Steps) == 0:
		row.Measured = "no step recorded"
	default:
		row.Measured = fmt.Sprintf("%s, the arena's high-water mark, the most of %d step(s)", plan.Bytes(hw), len(rep.Steps))
		row.Diff, row.Class = compare(float64(hw), float64(peak), rep.Plan != nil)
	}
	mv.Rows = append(mv.Rows, row)
	row = memoryRow{What: "device memory of the process (rank 0)", Planned: planned(total)}
	if rep.Plan != nil {
		row.Planned += fmt.Sprintf(" (arena %s + reserves %s)", plan.Bytes(rep.Plan.DeviceArena+rep.Plan.ResidentArena), plan.Bytes(rep.Plan.ReserveBytes()))
	}
	switch {
	case mv.Measured:
		row.Measured = fmt.Sprintf("%s, NVML, the most of %d step(s)", plan.Bytes(int64(nvml)), nvmlSteps)
		row.Diff, row.Class = compare(nvml, float64(total), rep.Plan != nil)
	case rep.Backend == "cpu":
		row.Measured, row.Class = "not measured (CPU run)", "none"
	default:
		row.Measured, row.Class = "not measured (the record has no NVML figure)", "none"
	}
	mv.Rows = append(mv.Rows, row)
	if asleepSteps > 0 {
		row = memoryRow{What: "device memory while the trainer slept (rank 0)", Planned: plan.Bytes(int64(asleepPlan)),
			Measured: fmt.Sprintf("%s, NVML, the most of %d step(s)", plan.Bytes(int64(asleep)), asleepSteps)}
		row.Diff, row.Class = compare(asleep, asleepPlan, true)
		mv.Rows = append(mv.Rows, row)
	}
	if h := rep.Header; h.Ranks > 1 {
		mv.Notes = append(mv.Notes, fmt.Sprintf("Every one of the %d ranks has the same plan; the arena's mark is rank 0's, and NVML is read for rank 0's GPU.", h.Ranks))
	}
	if len(rep.Steps) == 0 {
		return mv
	}
	// Per step: what was measured, against what was planned.
	ch := &chart{ID: "mem", Title: "memory per step", Note: "measured at every step's end, planned figures as flat lines", Source: "per step (metrics.jsonl)", Format: "bytes", FromZero: true}
	add := func(name string, get func(jobs.Metrics) (float64, bool), dashed bool) {
		var pts []point
		for _, s := range rep.Steps {
			if v, ok := get(s); ok {
				pts = append(pts, point{X: float64(s.Step), Y: v, Step: s.Step})
			}
		}
		if len(pts) > 0 {
			ch.Series = append(ch.Series, series{Name: name, Color: seriesColors[len(ch.Series)%len(seriesColors)], Points: pts, Dashed: dashed})
		}
	}
	flat := func(n int64) func(jobs.Metrics) (float64, bool) {
		return func(jobs.Metrics) (float64, bool) { return float64(n), true }
	}
	add("arena high-water (measured)", field(func(m jobs.Metrics) float64 { return float64(m.PeakMemBytes) }), false)
	if rep.Plan != nil {
		add("peak in use (planned)", flat(peak), true)
	}
	if mv.Measured {
		add("NVML, rank 0 (measured)", extra(NVMLKey), false)
		if rep.Plan != nil {
			add("device total (planned)", flat(total), true)
		}
	}
	mv.Charts = append(mv.Charts, ch)
	return mv
}

// compare words a measurement against its plan: equal, or over or under
// by how much.
func compare(measured, planned float64, havePlan bool) (string, string) {
	switch {
	case !havePlan || planned == 0:
		return "", "none"
	case measured == planned:
		return "equal to the plan", "ok"
	case measured < planned:
		return fmt.Sprintf("%s (%.1f%%) under the plan", plan.Bytes(int64(planned-measured)), 100*(planned-measured)/planned), "ok"
	}
	return fmt.Sprintf("%s (%.1f%%) over the plan", plan.Bytes(int64(measured-planned)), 100*(measured-planned)/planned), "over"
}
