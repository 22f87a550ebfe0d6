package runtime

import (
	"reflect"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/spec"
)

// in and out make ports for the flow tests.
func in(name, typ string) Input { return Input{Port: Port{Name: name, Type: typ}} }
func out(name, typ string) Port { return Port{Name: name, Type: typ} }

// from names the producer of an input, at a position on the stage's with:
// line (line 14+5k for the k-th def).
func from(i Input, id string, line int) Input {
	i.From, i.FromPos = id, spec.Pos{File: testFile, Line: line, Col: 20}
	return i
}

func optional(i Input) Input                { i.Optional = true; return i }
func atStart(i Input) Input                 { i.AtPhaseStart = true; return i }
func ports(ins []Input, outs ...Port) Ports { return Ports{In: ins, Out: outs} }

// testFlow returns a Flow with the given ports by stage id, the source
// "data.rollouts" for type rollouts, and a hint for every type.
func testFlow(p map[string]Ports) *Flow {
	return &Flow{
		Ports:   func(st *spec.Stage) Ports { return p[st.ID] },
		Sources: map[string]string{"rollouts": "data.rollouts"},
		Hint:    func(typ string) string { return "add a producer of " + typ },
	}
}

// grpoPorts are the ports of a GRPO pipeline like the standard kinds'.
var grpoPorts = map[string]Ports{
	"load":     ports(nil, out("checkpoint", "checkpoint/actor")),
	"shard_a":  ports([]Input{in("checkpoint", "checkpoint/actor")}, out("weights", "weights/actor")),
	"shard_r":  ports([]Input{in("checkpoint", "checkpoint/actor")}, out("weights", "weights/ref")),
	"pack":     ports([]Input{in("rollouts", "rollouts")}, out("batch", "batch")),
	"ref_lp":   ports([]Input{in("batch", "batch"), atStart(in("weights", "weights/ref"))}, out("logp", "log_probs/ref")),
	"old_lp":   ports([]Input{in("batch", "batch"), atStart(in("weights", "weights/actor"))}, out("logp", "log_probs/old")),
	"train":    ports([]Input{in("batch", "batch"), in("ref", "log_probs/ref"), optional(in("old", "log_probs/old")), in("weights", "weights/actor")}, out("weights", "weights/actor")),
	"sync_ref": ports([]Input{in("from", "weights/actor")}, out("weights", "weights/ref")),
}

// grpoBackwards lists the GRPO stages with no needs, the step stages in an
// order that the data edges must correct.
var grpoBackwards = []def{
	setup("shard_a", "apply_fsdp2"), setup("shard_r", "apply_fsdp2"), setup("load", "load_hf"),
	step("sync_ref", "update_ref"), step("train", "train"), step("old_lp", "actor_logprob"),
	step("ref_lp", "ref_logprob"), step("pack", "pack"),
}

func TestFlowOrder(t *testing.T) {
	g, err := Build(build(t, grpoBackwards...), testFlow(grpoPorts))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(g.Order(spec.Setup)), []string{"load", "shard_a", "shard_r"}; !reflect.DeepEqual(got, want) {
		t.Errorf("setup order %v, want %v", got, want)
	}
	if got, want := ids(g.Order(spec.Step)), []string{"pack", "old_lp", "ref_lp", "train", "sync_ref"}; !reflect.DeepEqual(got, want) {
		t.Errorf("step order %v, want %v", got, want)
	}
	var edges []string
	for _, e := range g.Edges() {
		edges = append(edges, e.String())
	}
	want := []string{
		"load.checkpoint -> shard_a.checkpoint", "load.checkpoint -> shard_r.checkpoint",
		"data.rollouts -> pack.rollouts",
		"pack.batch -> old_lp.batch", "shard_a.weights -> old_lp.weights",
		"pack.batch -> ref_lp.batch", "shard_r.weights -> ref_lp.weights",
		"pack.batch -> train.batch", "ref_lp.logp -> train.ref", "old_lp.logp -> train.old", "shard_a.weights -> train.weights",
		"train.weights -> sync_ref.from",
	}
	if !reflect.DeepEqual(edges, want) {
		t.Errorf("edges:\n%s\nwant:\n%s", strings.Join(edges, "\n"), strings.Join(want, "\n"))
	}
	if e := g.Node("train").Input("old"); e == nil || e.FromName() != "old_lp" {
		t.Errorf("train's old input is fed by %v, want old_lp", e)
	}
	// The optional old input is absent without an actor_logprob stage.
	p := map[string]Ports{}
	for k, v := range grpoPorts {
		if k != "old_lp" {
			p[k] = v
		}
	}
	var defs []def
	for _, d := range grpoBackwards {
		if d.id != "old_lp" {
			defs = append(defs, d)
		}
	}
	g, err = Build(build(t, defs...), testFlow(p))
	if err != nil {
		t.Fatal(err)
	}
	if e := g.Node("train").Input("old"); e != nil {
		t.Errorf("train's optional old input is fed by %v with no producer", e)
	}
}

func TestFlowErrors(t *testing.T) {
	tests := []struct {
		name  string
		defs  []def
		ports map[string]Ports
		want  []string
	}{
		{
			name:  "no producer",
			defs:  []def{step("train", "train")},
			ports: map[string]Ports{"train": ports([]Input{in("ref", "log_probs/ref")})},
			want:  []string{`job.yaml:11:13: stage "train" input "ref" (log_probs/ref): no stage produces it (add a producer of log_probs/ref)`},
		},
		{
			name: "ambiguous producer",
			defs: []def{step("a", "k"), step("b", "k"), step("c", "k")},
			ports: map[string]Ports{
				"a": ports(nil, out("logp", "log_probs/ref")), "b": ports(nil, out("logp", "log_probs/ref")),
				"c": ports([]Input{in("ref", "log_probs/ref")}),
			},
			want: []string{"job.yaml:21:13: stage \"c\" input \"ref\" (log_probs/ref): 2 stages produce it (\"a\", \"b\"); name one with `with: {ref: ID}`"},
		},
		{
			name: "named producer resolves the ambiguity",
			defs: []def{step("a", "k"), step("b", "k"), step("c", "k")},
			ports: map[string]Ports{
				"a": ports(nil, out("logp", "log_probs/ref")), "b": ports(nil, out("logp", "log_probs/ref")),
				"c": ports([]Input{from(in("ref", "log_probs/ref"), "b", 24)}),
			},
		},
		{
			name: "named producer unknown",
			defs: []def{step("ref_logp", "k"), step("c", "k")},
			ports: map[string]Ports{
				"ref_logp": ports(nil, out("logp", "log_probs/ref")),
				"c":        ports([]Input{from(in("ref", "log_probs/ref"), "ref_lopg", 19)}),
			},
			want: []string{`job.yaml:19:20: stage "c" input "ref" (log_probs/ref): no stage "ref_lopg" (did you mean "ref_logp"?)`},
		},
		{
			name: "named producer of another type",
			defs: []def{step("pack", "pack"), step("c", "k")},
			ports: map[string]Ports{
				"pack": ports(nil, out("batch", "batch")),
				"c":    ports([]Input{from(in("ref", "log_probs/ref"), "pack", 19)}),
			},
			want: []string{`job.yaml:19:20: stage "c" input "ref" (log_probs/ref): stage "pack" (pack) produces no log_probs/ref; its outputs: batch (batch)`},
		},
		{
			name:  "setup reads step",
			defs:  []def{setup("s", "k"), step("p", "k")},
			ports: map[string]Ports{"p": ports(nil, out("x", "x")), "s": ports([]Input{from(in("x", "x"), "p", 14)})},
			want:  []string{`job.yaml:14:20: stage "s" input "x" (x): "p" is a step stage, and setup stages run before every step`},
		},
		{
			name:  "setup reads step, inferred",
			defs:  []def{setup("s", "k"), step("p", "k")},
			ports: map[string]Ports{"p": ports(nil, out("x", "x")), "s": ports([]Input{in("x", "x")})},
			want:  []string{`job.yaml:11:13: stage "s" input "x" (x): no stage produces it (add a producer of x)`},
		},
		{
			name: "producer forced after its consumer",
			defs: []def{step("pack", "k"), step("ref_lp", "k", "train"), step("train", "k", "pack")},
			ports: map[string]Ports{
				"pack":   ports(nil, out("batch", "batch")),
				"ref_lp": ports([]Input{in("batch", "batch")}, out("logp", "log_probs/ref")),
				"train":  ports([]Input{in("batch", "batch"), in("ref", "log_probs/ref")}),
			},
			want: []string{`job.yaml:17:15: dependency cycle: ref_lp -> train -> ref_lp (ref_lp needs train; train reads ref_lp.logp)`},
		},
		{
			name: "state read at the step start after its writer",
			defs: []def{setup("shard", "k"), step("train", "k"), step("old_lp", "k", "train")},
			ports: map[string]Ports{
				"shard":  ports(nil, out("weights", "weights/actor")),
				"train":  ports([]Input{in("weights", "weights/actor")}, out("weights", "weights/actor")),
				"old_lp": ports([]Input{atStart(in("weights", "weights/actor"))}, out("logp", "log_probs/old")),
			},
			want: []string{`job.yaml:22:15: dependency cycle: train -> old_lp -> train (train writes weights/actor, which old_lp reads as it is when the step starts; old_lp needs train)`},
		},
		{
			name: "state read at the step start, named writer of the same step",
			defs: []def{setup("shard", "k"), step("train", "k"), step("old_lp", "k")},
			ports: map[string]Ports{
				"shard":  ports(nil, out("weights", "weights/actor")),
				"train":  ports([]Input{in("weights", "weights/actor")}, out("weights", "weights/actor")),
				"old_lp": ports([]Input{from(atStart(in("weights", "weights/actor")), "train", 24)}),
			},
			want: []string{`job.yaml:24:20: stage "old_lp" input "weights" (weights/actor): this input is read as it is when the step starts, and "train" writes it during the step`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Build(build(t, tt.defs...), testFlow(tt.ports))
			var got []string
			if err != nil {
				for _, e := range err.(spec.Errors) {
					got = append(got, e.Error())
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestCheckWhen(t *testing.T) {
	env := func(n *Node, step int) *spec.Env { return &spec.Env{Step: step} }
	tests := []struct {
		name  string
		defs  []def
		steps int
		want  []string
	}{
		{
			name:  "consumer runs only when its producer does",
			defs:  []def{step("p", "k").onlyWhen("step % 2 == 1"), step("c", "k").onlyWhen("step % 4 == 1")},
			steps: 12,
		},
		{
			name:  "consumer runs when its producer does not",
			defs:  []def{step("p", "k").onlyWhen("step % 2 == 1"), step("c", "k")},
			steps: 12,
			want:  []string{`job.yaml:15:7: stage "c" reads p.x, but at step 2 "p" does not run (when: step % 2 == 1) and "c" does (it has no when)`},
		},
		{
			name:  "differs only after the run's last step",
			defs:  []def{step("p", "k").onlyWhen("step <= 4"), step("c", "k")},
			steps: 4,
		},
		{
			name:  "differs at the last step",
			defs:  []def{step("p", "k").onlyWhen("step <= 4"), step("c", "k").onlyWhen("step != 3")},
			steps: 5,
			want:  []string{`job.yaml:18:13: stage "c" reads p.x, but at step 5 "p" does not run (when: step <= 4) and "c" does (when: step != 3)`},
		},
		{
			name:  "evaluation error",
			defs:  []def{step("p", "k"), step("c", "k").onlyWhen("step % (step - 3) == 0")},
			steps: 5,
			want:  []string{`job.yaml:18:13: stage "c", when at step 3: evaluating "step % (step - 3) == 0": runtime error: integer divide by zero (1:6)`},
		},
		{
			name:  "setup producer that never runs",
			defs:  []def{setup("p", "k").onlyWhen("step > 0"), step("c", "k")},
			steps: 2,
			want:  []string{`job.yaml:15:7: stage "c" reads p.x, but at step 1 "p" does not run (when: step > 0) and "c" does (it has no when)`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := Build(build(t, tt.defs...), testFlow(map[string]Ports{
				"p": ports(nil, out("x", "x")),
				"c": ports([]Input{in("x", "x")}),
			}))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range g.CheckWhen(tt.steps, env) {
				// The first line: expression errors continue with a snippet.
				got = append(got, strings.SplitN(e.Error(), "\n", 2)[0])
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestFlowOutput(t *testing.T) {
	g, err := Build(build(t, grpoBackwards...), testFlow(grpoPorts))
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "flow.txt", []byte(g.Text()))
	golden(t, "flow.dot", []byte(g.DOT()))
	js, err := g.JSON()
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "flow.json", js)
}
