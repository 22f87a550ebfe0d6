package runtime

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/spec"
)

const testFile = "job.yaml"

// def describes a stage for build.
type def struct {
	phase spec.Phase
	id    string
	uses  string
	needs []string
	when  string
}

func setup(id, uses string, needs ...string) def {
	return def{phase: spec.Setup, id: id, uses: uses, needs: needs}
}

func step(id, uses string, needs ...string) def {
	return def{phase: spec.Step, id: id, uses: uses, needs: needs}
}

func (d def) onlyWhen(src string) def { d.when = src; return d }

// build makes a spec from defs as if read from a file laid out like
//
//   - id: <id>           # line 10+5k, col 7 (the entry)
//     uses: <uses>       # line 11+5k, col 13
//     needs: [a, bb]     # line 12+5k, first name at col 15
//     when: <src>        # line 13+5k, col 13
//
// where k is the index of the def.
func build(t *testing.T, defs ...def) *spec.Spec {
	t.Helper()
	s := &spec.Spec{File: testFile}
	for k, d := range defs {
		line := 10 + 5*k
		st := &spec.Stage{
			ID:      d.id,
			Uses:    d.uses,
			Phase:   d.phase,
			Pos:     spec.Pos{File: testFile, Line: line, Col: 7},
			UsesPos: spec.Pos{File: testFile, Line: line + 1, Col: 13},
		}
		col := 15
		for _, n := range d.needs {
			st.Needs = append(st.Needs, spec.Ref{Name: n, Pos: spec.Pos{File: testFile, Line: line + 2, Col: col}})
			col += len(n) + 2
		}
		if d.when != "" {
			st.When = compileWhen(t, d.when, spec.Pos{File: testFile, Line: line + 3, Col: 13})
		}
		if d.phase == spec.Setup {
			s.Setup = append(s.Setup, st)
		} else {
			s.Step = append(s.Step, st)
		}
	}
	return s
}

// compileWhen compiles a `when` expression with spec.Compile.
func compileWhen(t *testing.T, src string, pos spec.Pos) *spec.Expr {
	t.Helper()
	e, err := spec.Compile(src, pos, reflect.Bool)
	if err != nil {
		t.Fatalf("compile %q: %v", src, err)
	}
	return e
}

func TestNewGraphErrors(t *testing.T) {
	tests := []struct {
		name string
		defs []def
		want []string
	}{
		{
			name: "two-cycle",
			defs: []def{step("a", "k", "b"), step("b", "k", "a")},
			want: []string{`job.yaml:12:15: dependency cycle: a -> b -> a (each stage needs the next)`},
		},
		{
			name: "three-cycle",
			defs: []def{step("x", "k"), step("a", "k", "x", "c"), step("b", "k", "a"), step("c", "k", "b")},
			want: []string{`job.yaml:17:18: dependency cycle: a -> c -> b -> a (each stage needs the next)`},
		},
		{
			name: "two separate cycles",
			defs: []def{
				step("a", "k", "b"), step("b", "k", "a"),
				step("ok", "k", "a"),
				step("p", "k", "r"), step("q", "k", "p"), step("r", "k", "q"),
			},
			want: []string{
				`job.yaml:12:15: dependency cycle: a -> b -> a (each stage needs the next)`,
				`job.yaml:27:15: dependency cycle: p -> r -> q -> p (each stage needs the next)`,
			},
		},
		{
			name: "cycle in setup",
			defs: []def{setup("a", "k", "b"), setup("b", "k", "a"), step("c", "k", "a")},
			want: []string{`job.yaml:12:15: dependency cycle: a -> b -> a (each stage needs the next)`},
		},
		{
			name: "self need",
			defs: []def{step("a", "k"), step("b", "k", "a", "b")},
			want: []string{`job.yaml:17:18: stage "b" needs itself`},
		},
		{
			name: "unknown need with suggestion",
			defs: []def{step("train", "train"), step("update_ref", "update_ref", "trian")},
			want: []string{`job.yaml:17:15: stage "update_ref" needs unknown stage "trian"; did you mean "train"?`},
		},
		{
			name: "unknown need without suggestion",
			defs: []def{step("train", "train"), step("update_ref", "update_ref", "pack")},
			want: []string{`job.yaml:17:15: stage "update_ref" needs unknown stage "pack"`},
		},
		{
			name: "duplicate id",
			defs: []def{setup("load", "load_hf"), step("pack", "pack"), step("load", "load_hf")},
			want: []string{`job.yaml:20:7: duplicate stage id "load" (first defined at job.yaml:10:7)`},
		},
		{
			name: "duplicate id needs still checked",
			defs: []def{step("a", "k"), step("a", "k", "nope")},
			want: []string{
				`job.yaml:15:7: duplicate stage id "a" (first defined at job.yaml:10:7)`,
				`job.yaml:17:15: stage "a" needs unknown stage "nope"`,
			},
		},
		{
			name: "setup needs step",
			defs: []def{setup("load", "load_hf", "pack"), step("pack", "pack")},
			want: []string{`job.yaml:12:15: setup stage "load" needs step stage "pack", but setup stages run before any step stage`},
		},
		{
			name: "need listed twice",
			defs: []def{step("a", "k"), step("b", "k", "a", "a")},
			want: []string{`job.yaml:17:18: stage "b" lists "a" in needs more than once`},
		},
		{
			name: "missing id",
			defs: []def{step("", "k")},
			want: []string{`job.yaml:10:7: step stage has no id`},
		},
		{
			name: "every problem reported in file order",
			defs: []def{
				setup("load", "load_hf", "train"),
				step("train", "train", "lp", "ghost"),
				step("lp", "actor_logprob", "train"),
				step("train", "train"),
				step("z", "k", "z"),
			},
			want: []string{
				`job.yaml:12:15: setup stage "load" needs step stage "train", but setup stages run before any step stage`,
				`job.yaml:17:15: dependency cycle: train -> lp -> train (each stage needs the next)`,
				`job.yaml:17:19: stage "train" needs unknown stage "ghost"`,
				`job.yaml:25:7: duplicate stage id "train" (first defined at job.yaml:15:7)`,
				`job.yaml:32:15: stage "z" needs itself`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := NewGraph(build(t, tt.defs...))
			if err == nil {
				t.Fatalf("NewGraph succeeded, want errors:\n%s", strings.Join(tt.want, "\n"))
			}
			if g != nil {
				t.Errorf("NewGraph returned a graph with errors")
			}
			var list spec.Errors
			if !errors.As(err, &list) {
				t.Fatalf("error is %T, want spec.Errors", err)
			}
			var got []string
			for _, e := range list {
				got = append(got, e.Error())
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestNewGraphMalformed(t *testing.T) {
	tests := []struct {
		name string
		spec *spec.Spec
		want string
	}{
		{"nil spec", nil, "no spec"},
		{"nil stage", &spec.Spec{File: testFile, Step: []*spec.Stage{nil}}, "job.yaml: stages.step[0] is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := NewGraph(tt.spec)
			if err == nil || err.Error() != tt.want || g != nil {
				t.Errorf("NewGraph = %v, %v; want error %q", g, err, tt.want)
			}
		})
	}
}

func ids(nodes []*Node) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.Stage.ID
	}
	return out
}

func TestOrder(t *testing.T) {
	tests := []struct {
		name      string
		defs      []def
		wantSetup []string
		wantStep  []string
	}{
		{
			name:     "file order when independent",
			defs:     []def{step("c", "k"), step("a", "k"), step("b", "k")},
			wantStep: []string{"c", "a", "b"},
		},
		{
			name:     "ties broken by file order",
			defs:     []def{step("d", "k", "c"), step("a", "k"), step("c", "k"), step("b", "k", "a")},
			wantStep: []string{"a", "c", "d", "b"},
		},
		{
			name:     "chain declared backwards",
			defs:     []def{step("c", "k", "b"), step("b", "k", "a"), step("a", "k")},
			wantStep: []string{"a", "b", "c"},
		},
		{
			name:     "diamond",
			defs:     []def{step("train", "k", "ref", "act"), step("ref", "k", "pack"), step("act", "k", "pack"), step("pack", "k")},
			wantStep: []string{"pack", "ref", "act", "train"},
		},
		{
			name: "step needing setup is satisfied by the phase",
			defs: []def{
				setup("load", "load_hf"), setup("shard", "apply_fsdp2", "load"),
				step("lp", "k", "pack", "shard"), step("pack", "k", "load"),
			},
			wantSetup: []string{"load", "shard"},
			wantStep:  []string{"pack", "lp"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := NewGraph(build(t, tt.defs...))
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				phase spec.Phase
				want  []string
			}{{spec.Setup, tt.wantSetup}, {spec.Step, tt.wantStep}} {
				order := g.Order(c.phase)
				if got := ids(order); !reflect.DeepEqual(got, c.want) && (len(got) > 0 || len(c.want) > 0) {
					t.Errorf("%s order = %v, want %v", c.phase, got, c.want)
				}
				for i, n := range order {
					if n.Index != i {
						t.Errorf("%s: Index = %d, want %d", n.Stage.ID, n.Index, i)
					}
					for _, d := range n.Needs {
						if d.Phase == n.Phase && d.Index >= n.Index {
							t.Errorf("%s (index %d) runs before its need %s (index %d)", n.Stage.ID, n.Index, d.Stage.ID, d.Index)
						}
					}
				}
			}
			if g.Order("bogus") != nil {
				t.Errorf("Order of an unknown phase is not nil")
			}
		})
	}
}

func TestEdges(t *testing.T) {
	g, err := NewGraph(build(t,
		setup("load", "load_hf"),
		step("train", "train", "b", "a", "load"), step("a", "k"), step("b", "k"), step("c", "k", "a"),
	))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(g.Node("train").Needs), []string{"b", "a", "load"}; !reflect.DeepEqual(got, want) {
		t.Errorf("train needs %v, want %v", got, want)
	}
	if got, want := ids(g.Node("a").Dependents), []string{"train", "c"}; !reflect.DeepEqual(got, want) {
		t.Errorf("a dependents %v, want %v", got, want)
	}
	if got, want := ids(g.Node("load").Dependents), []string{"train"}; !reflect.DeepEqual(got, want) {
		t.Errorf("load dependents %v, want %v", got, want)
	}
	if got, want := ids(g.Nodes()), []string{"load", "train", "a", "b", "c"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Nodes() = %v, want %v", got, want)
	}
	if g.Node("nope") != nil {
		t.Errorf("Node of an unknown id is not nil")
	}
}

func TestActive(t *testing.T) {
	tests := []struct {
		name    string
		when    string
		env     *spec.Env
		want    bool
		wantErr string
	}{
		{name: "no when", want: true},
		{name: "no when nil env", env: nil, want: true},
		{name: "true", when: "step % 10 == 0", env: &spec.Env{Step: 20}, want: true},
		{name: "false", when: "step % 10 == 0", env: &spec.Env{Step: 21}, want: false},
		{name: "nil env is zero", when: "step == 0", want: true},
		{name: "stage filled from node", when: `stage.id == "s" && stage.kind == "update_ref"`, env: &spec.Env{Step: 3}, want: true},
		{name: "stage from env kept", when: `stage.id == "s"`, env: &spec.Env{Stage: spec.StageEnv{ID: "other"}}, want: false},
		{name: "evaluation error names stage", when: `int(stage.id) > 0`, wantErr: `stage "s": when: job.yaml:13:13: evaluating`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := step("s", "update_ref")
			if tt.when != "" {
				d = d.onlyWhen(tt.when)
			}
			g, err := NewGraph(build(t, d))
			if err != nil {
				t.Fatal(err)
			}
			var env *spec.Env
			if tt.env != nil {
				e := *tt.env
				env = &e
			}
			got, err := g.Active(g.Node("s"), env)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Active error = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("Active = %v, want %v", got, tt.want)
			}
			if env != nil && *env != *tt.env {
				t.Errorf("Active modified the caller's env")
			}
		})
	}
	if _, err := (&Graph{}).Active(nil, nil); err == nil {
		t.Errorf("Active(nil) succeeded")
	}
}

func TestSuggest(t *testing.T) {
	ids := []string{"pack", "ref_logprob", "actor_logprob", "train", "update_ref"}
	tests := []struct{ name, want string }{
		{"trian", "train"},
		{"Train", "train"},
		{"ref_logprb", "ref_logprob"},
		{"actor_log_prob", "actor_logprob"},
		{"update", "update_ref"},
		{"x", ""},
		{"load", ""},
	}
	for _, tt := range tests {
		if got := suggest(tt.name, ids); got != tt.want {
			t.Errorf("suggest(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
}
