package report

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/rlpipe/rlpipe/jobs"
)

// deviceView is the page's "Device time" section: rank 0's compute stream,
// by stage, in the last step the record has a timeline of (run
// --timeline K).
type deviceView struct {
	Step int
	File string // the trace, relative to the run directory
	Rows []deviceRow
}

// deviceRow is one stage of the traced step.
type deviceRow struct {
	Stage  string
	Span   string // first op's start to last op's end, ms
	Idle   string // no op since the stage before it ended, ms; "" for the step's first
	Waited string // the compute stream's waits for the side or Down stream, ms
	Ops    string // the stage's largest op kinds, with their ms
}

// topOps is how many op kinds a row names.
const topOps = 4

// layerIndex drops a layer's index from an op's name ("layer7 gate_up").
var layerIndex = regexp.MustCompile(`\blayer\d+\b ?`)

// traceEvent is what the section reads of a span of the trace.
type traceEvent struct {
	Name string            `json:"name"`
	Ph   string            `json:"ph"`
	Ts   float64           `json:"ts"` // µs
	Dur  float64           `json:"dur"`
	Tid  string            `json:"tid"`
	Args map[string]string `json:"args"`
}

// device reads the record's last timeline. It returns nil, and no error,
// when the record has none.
func (rep *Report) device() (*deviceView, error) {
	dir := filepath.Join(rep.Dir, jobs.TimelineDir)
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	step, name := 0, ""
	for _, e := range ents {
		var s int
		if _, err := fmt.Sscanf(e.Name(), "step-%06d.json", &s); err == nil && e.Name() == jobs.TimelineFile(s) && s > step {
			step, name = s, e.Name()
		}
	}
	if name == "" {
		return nil, nil
	}
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	var doc struct {
		TraceEvents []traceEvent `json:"traceEvents"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(jobs.TimelineDir, name), err)
	}
	v := &deviceView{Step: step, File: filepath.Join(jobs.TimelineDir, name)}
	type stage struct {
		first, last, waited float64
		ops                 map[string]float64
	}
	var order []string
	stages := map[string]*stage{}
	var waits []traceEvent
	for _, e := range doc.TraceEvents {
		switch {
		case e.Ph != "X":
		case e.Tid == "compute":
			id := e.Args["stage"]
			if id == "" {
				return nil, fmt.Errorf("%s: compute spans without their stage (a trace from before rlpipe recorded it)", v.File)
			}
			st := stages[id]
			if st == nil {
				st = &stage{first: e.Ts, last: e.Ts + e.Dur, ops: map[string]float64{}}
				stages[id] = st
				order = append(order, id)
			}
			st.first, st.last = min(st.first, e.Ts), max(st.last, e.Ts+e.Dur)
			st.ops[strings.TrimSpace(layerIndex.ReplaceAllString(e.Name, ""))] += e.Dur
		case e.Tid == "compute wait":
			waits = append(waits, e)
		}
	}
	for _, e := range waits {
		if id, _, ok := strings.Cut(e.Name, ": "); ok && stages[id] != nil {
			stages[id].waited += e.Dur
		}
	}
	sort.SliceStable(order, func(i, j int) bool { return stages[order[i]].first < stages[order[j]].first })
	ms := func(us float64) string { return fmt.Sprintf("%.1f", us/1e3) }
	for i, id := range order {
		st := stages[id]
		row := deviceRow{Stage: id, Span: ms(st.last - st.first), Waited: ms(st.waited)}
		if i > 0 {
			row.Idle = ms(max(0, st.first-stages[order[i-1]].last))
		}
		kinds := make([]string, 0, len(st.ops))
		for k := range st.ops {
			kinds = append(kinds, k)
		}
		slices.SortFunc(kinds, func(a, b string) int { // largest first, then by name
			return cmp.Or(cmp.Compare(st.ops[b], st.ops[a]), strings.Compare(a, b))
		})
		var parts []string
		for _, k := range kinds[:min(topOps, len(kinds))] {
			parts = append(parts, fmt.Sprintf("%s %s", k, ms(st.ops[k])))
		}
		row.Ops = strings.Join(parts, ", ")
		v.Rows = append(v.Rows, row)
	}
	return v, nil
}
