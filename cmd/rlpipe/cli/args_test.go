package cli

import (
	"encoding/json"
	"flag"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseInterspersed(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		pos   []string
		steps int
		json  bool
		out   string
		err   string // "" for none
	}{
		{"flags first", []string{"--steps", "3", "--json", "a"}, []string{"a"}, 3, true, "", ""},
		{"flags after", []string{"a", "--steps", "3", "--json"}, []string{"a"}, 3, true, "", ""},
		{"between", []string{"a", "-steps=4", "b", "-json"}, []string{"a", "b"}, 4, true, "", ""},
		{"negative value", []string{"--steps", "-3", "a"}, []string{"a"}, -3, false, "", ""},
		{"bool takes no value", []string{"--json", "a"}, []string{"a"}, 0, true, "", ""},
		{"bool off", []string{"--json=false", "a"}, []string{"a"}, 0, false, "", ""},
		{"empty value", []string{"--out", "", "a"}, []string{"a"}, 0, false, "", ""},
		{"value that looks like a flag", []string{"--out", "--json"}, nil, 0, false, "--json", ""},
		{"double dash", []string{"--json", "--", "--steps", "-"}, []string{"--steps", "-"}, 0, true, "", ""},
		{"lone dash", []string{"-"}, []string{"-"}, 0, false, "", ""},
		{"unknown", []string{"a", "--frob"}, nil, 0, false, "", "unknown flag --frob"},
		{"no value", []string{"a", "--steps"}, nil, 0, false, "", "flag --steps needs a value"},
		{"bad value", []string{"--steps", "x"}, nil, 0, false, "", "--steps x: not an integer"},
		{"help after", []string{"a", "-h"}, nil, 0, false, "", flag.ErrHelp.Error()},
		{"help after double dash", []string{"--", "-h"}, []string{"-h"}, 0, false, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			steps := fs.Int("steps", 0, "")
			asJSON := fs.Bool("json", false, "")
			out := fs.String("out", "", "")
			pos, err := parseInterspersed(fs, tt.args)
			if tt.err != "" {
				if err == nil || err.Error() != tt.err {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(pos, tt.pos) || *steps != tt.steps || *asJSON != tt.json || *out != tt.out {
				t.Errorf("got %q steps %d json %v out %q, want %q %d %v %q", pos, *steps, *asJSON, *out, tt.pos, tt.steps, tt.json, tt.out)
			}
		})
	}
}

// TestCommandLine checks the command-line conventions every command
// follows: flags before or after the arguments, help on stdout with exit
// 0, and usage errors as one line on stderr with exit 2.
func TestCommandLine(t *testing.T) {
	runs := t.TempDir()
	tests := []struct {
		name   string
		args   []string
		want   int
		stdout string // expected in stdout
		stderr string // expected in stderr; "" for an empty stderr
	}{
		{"plan flags after the spec", []string{"plan", tinySpec, "--json", "--gpu", "h100-80g"}, exitOK, `"fits": true`, ""},
		{"validate flags after the spec", []string{"validate", tinySpec, "--gpu=h100-80g"}, exitOK, ": ok (", ""},
		{"graph flags after the spec", []string{"graph", tinySpec, "--dot"}, exitOK, "digraph", ""},
		{"run flags after the spec", []string{"run", tinySpec, "--backend", "tpu"}, exitUsage, "", "--backend"},
		{"--version", []string{"--version"}, exitOK, "rlpipe " + version, ""},
		{"--steps negative", []string{"run", tinySpec, "--runs", runs, "--steps", "-3"}, exitUsage, "", "--steps -3: must be at least 1"},
		{"--steps beyond train.steps", []string{"run", tinySpec, "--runs", runs, "--steps", "13"}, exitUsage, "", "--steps 13: beyond the spec's train.steps (12)"},
		{"--steps not a number", []string{"run", tinySpec, "--steps", "x"}, exitUsage, "", "--steps x: not an integer"},
		{"unknown flag", []string{"plan", tinySpec, "--frob"}, exitUsage, "", "rlpipe plan: unknown flag --frob (see 'rlpipe plan -h')\n"},
		{"flag without its value", []string{"plan", tinySpec, "--gpu"}, exitUsage, "", "flag --gpu needs a value"},
		{"missing argument", []string{"validate"}, exitUsage, "", "rlpipe validate: missing SPEC.yaml (see 'rlpipe validate -h')\n"},
		{"extra argument", []string{"graph", tinySpec, "extra"}, exitUsage, "", `unexpected argument "extra"`},
		{"run with spec and --resume", []string{"run", tinySpec, "--resume", "x"}, exitUsage, "", "not both"},
		{"jobs without subcommand", []string{"jobs"}, exitUsage, "", "missing list|show"},
		{"jobs show without run", []string{"jobs", "show", "--runs", runs}, exitUsage, "", "missing RUN"},
		{"jobs unknown subcommand", []string{"jobs", "frob"}, exitUsage, "", `unknown subcommand "frob"`},
		{"unknown command", []string{"frob"}, exitUsage, "", "rlpipe: unknown command \"frob\" (see 'rlpipe -h')\n"},
		{"unknown top flag", []string{"--frob"}, exitUsage, "", "unknown flag --frob"},
		{"unknown shell", []string{"completion", "csh"}, exitUsage, "", `unknown shell "csh"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tt.args...)
			if code != tt.want || !strings.Contains(stdout, tt.stdout) || (tt.stderr == "") != (stderr == "") || !strings.Contains(stderr, tt.stderr) {
				t.Errorf("exit %d, want %d with %q on stdout and %q on stderr:\n--- stdout\n%.400s\n--- stderr\n%s", code, tt.want, tt.stdout, tt.stderr, stdout, stderr)
			}
			if tt.want == exitUsage && strings.Count(stderr, "\n") != 1 {
				t.Errorf("usage error is not one line:\n%s", stderr)
			}
		})
	}
}

// TestHelp asks every command for help in each way: help is the
// command's usage on stdout, with exit 0 and nothing on stderr.
func TestHelp(t *testing.T) {
	ways := [][]string{{"-h"}, {"--help"}, {"help"}}
	for _, c := range commands() {
		ways = append(ways, []string{c.name, "-h"}, []string{c.name, "--help"}, []string{"help", c.name}, []string{c.name, "x", "-h"})
	}
	ways = append(ways, []string{"jobs", "list", "-h"}, []string{"jobs", "show", "--runs", "d", "-h"})
	for _, args := range ways {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, stdout, stderr := runCLI(t, args...)
			if code != exitOK || stderr != "" || !strings.Contains(stdout, "Usage") {
				t.Errorf("exit %d, stderr %q, stdout:\n%s", code, stderr, stdout)
			}
		})
	}
}

// TestRunFlagsAfterSpec runs a step with every flag after the spec, then
// reads the record back with jobs, flags last, as text and as JSON.
func TestRunFlagsAfterSpec(t *testing.T) {
	runs := t.TempDir()
	if code, out, errs := runCLI(t, "run", tinySpec, "--runs", runs, "--steps", "1", "--backend", "cpu", "--export", ""); code != exitOK {
		t.Fatalf("run exit %d:\n%s%s", code, out, errs)
	}
	code, out, errs := runCLI(t, "jobs", "list", "--runs", runs, "--json")
	var list []struct {
		ID       string `json:"id"`
		Name     string `json:"name"`
		Status   string `json:"status"`
		LastStep int    `json:"last_step"`
	}
	if code != exitOK {
		t.Fatalf("jobs list --json exit %d: %s", code, errs)
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0].Name != "tiny-grpo" || list[0].Status != "stopped" || list[0].LastStep != 1 {
		t.Fatalf("jobs list --json: %v\n%s", err, out)
	}
	id := list[0].ID[:8]
	if code, out, errs := runCLI(t, "jobs", "show", id, "--runs", runs); code != exitOK || !strings.Contains(out, "status   stopped") || !strings.Contains(out, "ckpts    steps 1") {
		t.Errorf("jobs show ID --runs D: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = runCLI(t, "jobs", "--json", "show", id, "--runs", runs)
	var show struct {
		ID          string `json:"id"`
		Dir         string `json:"dir"`
		Checkpoints []int  `json:"checkpoints"`
		Metrics     []struct {
			Step int `json:"step"`
		} `json:"metrics"`
	}
	if code != exitOK {
		t.Fatalf("jobs show --json exit %d: %s", code, errs)
	}
	if err := json.Unmarshal([]byte(out), &show); err != nil || show.ID != list[0].ID || show.Dir == "" || !reflect.DeepEqual(show.Checkpoints, []int{1}) || len(show.Metrics) != 1 || show.Metrics[0].Step != 1 {
		t.Errorf("jobs show --json: %v\n%s", err, out)
	}
	if code, out, _ := runCLI(t, "jobs", "list", "--json", "--runs", filepath.Join(runs, "none")); code != exitOK || strings.TrimSpace(out) != "[]" {
		t.Errorf("jobs list --json of no runs: exit %d: %q", code, out)
	}
}

func TestValidateJSON(t *testing.T) {
	type result struct {
		OK     bool   `json:"ok"`
		File   string `json:"file"`
		Models int    `json:"models"`
		Errors []struct {
			File    string `json:"file"`
			Line    int    `json:"line"`
			Col     int    `json:"col"`
			Message string `json:"message"`
		} `json:"errors"`
	}
	code, out, errs := runCLI(t, "validate", tinySpec, "--json")
	var good result
	if err := json.Unmarshal([]byte(out), &good); code != exitOK || err != nil || !good.OK || good.File != tinySpec || good.Models != 2 || good.Errors == nil || len(good.Errors) != 0 {
		t.Errorf("validate --json of a good spec: exit %d, %v\n%s%s", code, err, out, errs)
	}
	broken := filepath.Join("testdata", "broken.yaml")
	code, out, errs = runCLI(t, "validate", "--json", broken)
	var bad result
	if err := json.Unmarshal([]byte(out), &bad); code != exitInvalid || err != nil || bad.OK || errs != "" {
		t.Fatalf("validate --json of a broken spec: exit %d, %v\n%s%s", code, err, out, errs)
	}
	// The JSON holds the problems the text report lists, in its order.
	_, _, text := runCLI(t, "validate", broken)
	var lines []string
	for _, e := range bad.Errors {
		if e.File != broken || e.Line <= 0 || e.Col <= 0 {
			t.Errorf("problem without a position: %+v", e)
		}
		lines = append(lines, fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Col, e.Message))
	}
	var want []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, broken+":") {
			want = append(want, l)
		}
	}
	if len(want) == 0 || !reflect.DeepEqual(lines, want) {
		t.Errorf("validate --json problems:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}
