package report

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/jobs"
)

// traceOf is a trace of two stages: ref_logp's ops (two layers' gate_up,
// 2 and 1 ms, and a head op, 0.5 ms) from 0 to 3.5 ms, then, 1 ms later,
// train's one op of 4 ms, inside which the compute stream waited 0.3 ms
// for a gather.
const traceOf = `{"traceEvents":[
{"name":"layer0 gate_up","ph":"X","ts":0,"dur":2000,"pid":0,"tid":"compute","args":{"stage":"ref_logp"}},
{"name":"layer1 gate_up","ph":"X","ts":2000,"dur":1000,"pid":0,"tid":"compute","args":{"stage":"ref_logp"}},
{"name":"head log-prob chunks","ph":"X","ts":3000,"dur":500,"pid":0,"tid":"compute","args":{"stage":"ref_logp"}},
{"name":"gather layer0","ph":"X","ts":4000,"dur":900,"pid":0,"tid":"side"},
{"name":"train: gather layer0","ph":"X","ts":4500,"dur":300,"pid":0,"tid":"compute wait"},
{"name":"layer0 gate_up backward","ph":"X","ts":4500,"dur":4000,"pid":0,"tid":"compute","args":{"stage":"train"}}
],"metadata":{}}`

// TestDeviceTime checks the report's "Device time" section: the last
// traced step's stages, their spans, idle time, waits and largest ops; a
// record without a timeline says how to get one, and a trace it cannot
// use is a warning on the page.
func TestDeviceTime(t *testing.T) {
	for _, tt := range []struct {
		name  string
		files map[string]string // in the record's timeline directory
		want  []string
	}{
		{"no timeline", nil, []string{"The record has no step's timeline"}},
		{"two traced steps", map[string]string{jobs.TimelineFile(2): `{"traceEvents":[]}`, jobs.TimelineFile(4): traceOf, "notes.txt": "x"},
			[]string{"Step 4's timeline", "timeline/step-000004.json",
				"<tr><th>ref_logp</th><td>3.5</td><td></td><td>0.0</td><td class=\"ops\">gate_up 3.0, head log-prob chunks 0.5</td></tr>",
				"<tr><th>train</th><td>4.0</td><td>1.0</td><td>0.3</td><td class=\"ops\">gate_up backward 4.0</td></tr>"}},
		{"a trace without stages", map[string]string{jobs.TimelineFile(1): strings.ReplaceAll(traceOf, `,"args":{"stage":"ref_logp"}`, "")},
			[]string{"device time: timeline/step-000001.json: compute spans without their stage", "The record has no step's timeline"}},
		{"a damaged trace", map[string]string{jobs.TimelineFile(1): traceOf[:40]},
			[]string{"device time: timeline/step-000001.json: unexpected end of JSON input"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := record{steps: 2, updatesPerStep: 1}.write(t)
			if tt.files != nil {
				dir := filepath.Join(r.Dir(), jobs.TimelineDir)
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				for name, data := range tt.files {
					if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			var buf bytes.Buffer
			if err := Write(&buf, r); err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(buf.String(), w) {
					t.Errorf("the page has no %q", w)
				}
			}
		})
	}
}
