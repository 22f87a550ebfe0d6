package runtime

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/rlpipe/rlpipe/spec"
)

// Port is one typed data input or output of a stage.
type Port struct {
	// Name is unique among the stage's inputs, and among its outputs.
	Name string
	// Type is what flows through the port, e.g. "batch", "log_probs/ref" or
	// "weights/actor". An input is fed by an output of the same type.
	Type string
}

// Input is a port a stage reads.
type Input struct {
	Port
	// From is the id of the producing stage as the spec names it (a stage
	// names it in its `with:` block under the input's name), or "" to use
	// the one stage that produces Type.
	From string
	// FromPos is the position of From in the spec.
	FromPos spec.Pos
	// Optional inputs may have no producer; the stage then does without.
	Optional bool
	// AtPhaseStart reads the state of Type as it is when the phase starts:
	// the producer is found in an earlier phase (or a source), and the stage
	// runs before every stage of its own phase that writes Type. The
	// log-prob stages read a model's weights this way: before the step's
	// updates.
	AtPhaseStart bool
}

// Ports are the inputs and outputs a stage declares.
type Ports struct {
	In  []Input
	Out []Port
}

// Flow tells Build how the stages of a spec exchange data.
type Flow struct {
	// Ports returns the ports of a stage; nil or a stage it returns no
	// ports for takes part in ordering through needs only.
	Ports func(st *spec.Stage) Ports
	// Sources names, by type, what feeds an input that no stage produces,
	// e.g. "rollouts" -> "data.rollouts" (the job's rollout file).
	Sources map[string]string
	// Hint says how a missing type is produced, for the error of an input
	// nothing feeds ("add a ref_logprob stage"); it may return "".
	Hint func(typ string) string
}

// Edge is one data edge: output Out of stage From (or the source Source,
// when From is nil) feeds input In of stage To.
type Edge struct {
	From   *Node
	Source string
	Out    string
	To     *Node
	In     string
	Type   string
}

// FromName is the producing stage's id, or the source's name.
func (e *Edge) FromName() string {
	if e.From == nil {
		return e.Source
	}
	return e.From.Stage.ID
}

// String renders the edge as "producer.out -> consumer.in".
func (e *Edge) String() string {
	from := e.Source
	if e.From != nil {
		from = e.From.Stage.ID + "." + e.Out
	}
	return from + " -> " + e.To.Stage.ID + "." + e.In
}

// depKind says why a stage runs after another.
type depKind int

const (
	depNeeds  depKind = iota // listed in needs
	depData                  // reads the other's output
	depBefore                // the other reads, as at the phase start, a state this one writes
)

// dep is one reason for a node to run after dep.on.
type dep struct {
	on   *Node
	kind depKind
	pos  spec.Pos // the needs reference (depNeeds)
	edge *Edge    // depData
	typ  string   // depBefore: the state type
}

// describe says why from runs after d.on, for cycle errors.
func (d dep) describe(from *Node) string {
	switch d.kind {
	case depData:
		return fmt.Sprintf("%s reads %s.%s", from.Stage.ID, d.on.Stage.ID, d.edge.Out)
	case depBefore:
		return fmt.Sprintf("%s writes %s, which %s reads as it is when the %s starts", from.Stage.ID, d.typ, d.on.Stage.ID, from.Phase)
	}
	return fmt.Sprintf("%s needs %s", from.Stage.ID, d.on.Stage.ID)
}

// producesType returns the name of n's output of type typ, or "".
func (n *Node) producesType(typ string) string {
	for _, p := range n.Ports.Out {
		if p.Type == typ {
			return p.Name
		}
	}
	return ""
}

// inputPort returns n's declared input named name.
func (n *Node) inputPort(name string) Input {
	for _, in := range n.Ports.In {
		if in.Name == name {
			return in
		}
	}
	return Input{}
}

// Input returns the data edge feeding n's input named in, or nil when the
// input is optional and nothing feeds it.
func (n *Node) Input(in string) *Edge {
	for _, e := range n.Inputs {
		if e.In == in {
			return e
		}
	}
	return nil
}

// flow derives the data edges of g's nodes from their ports and adds the
// ordering they imply. It reports inputs with no producer, ambiguous
// producers, producers named in the spec that do not exist or do not
// produce the type, and reads of a later phase.
func (g *Graph) flow(f *Flow) spec.Errors {
	var errs spec.Errors
	if f == nil || f.Ports == nil {
		return nil
	}
	for _, n := range g.nodes {
		n.Ports = f.Ports(n.Stage)
		seen := map[string]bool{}
		for _, p := range n.Ports.Out {
			if seen[p.Name] {
				errs.Addf(n.Stage.UsesPos, "stage %q declares output %q twice", n.Stage.ID, p.Name)
			}
			seen[p.Name] = true
		}
	}
	ids := make([]string, 0, len(g.nodes))
	for _, n := range g.nodes {
		ids = append(ids, n.Stage.ID)
	}
	for _, n := range g.nodes {
		for _, in := range n.Ports.In {
			e, err := g.producer(n, in, f, ids)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if e == nil {
				continue
			}
			n.Inputs = append(n.Inputs, e)
			if e.From != nil {
				e.From.Outputs = append(e.From.Outputs, e)
				n.deps = append(n.deps, dep{on: e.From, kind: depData, edge: e})
			}
			if in.AtPhaseStart {
				for _, w := range g.nodes {
					if w != n && w.Phase == n.Phase && w.producesType(in.Type) != "" {
						w.deps = append(w.deps, dep{on: n, kind: depBefore, typ: in.Type})
					}
				}
			}
		}
	}
	return errs
}

// producer finds the edge that feeds input in of n.
func (g *Graph) producer(n *Node, in Input, f *Flow, ids []string) (*Edge, *spec.Error) {
	what := fmt.Sprintf("stage %q input %q (%s)", n.Stage.ID, in.Name, in.Type)
	edge := func(p *Node) (*Edge, *spec.Error) {
		return &Edge{From: p, Out: p.producesType(in.Type), To: n, In: in.Name, Type: in.Type}, nil
	}
	earlier := func(p *Node) bool { return p.Phase == spec.Setup && n.Phase == spec.Step }
	if in.From != "" {
		p, ok := g.byID[in.From]
		switch {
		case !ok:
			msg := fmt.Sprintf("%s: no stage %q", what, in.From)
			if s := suggest(in.From, ids); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			return nil, spec.Errorf(in.FromPos, "%s", msg)
		case p == n:
			return nil, spec.Errorf(in.FromPos, "%s: a stage cannot read its own output", what)
		case p.producesType(in.Type) == "":
			return nil, spec.Errorf(in.FromPos, "%s: stage %q (%s) produces no %s; its outputs: %s", what, in.From, p.Stage.Uses, in.Type, outputList(p))
		case n.Phase == spec.Setup && p.Phase == spec.Step:
			return nil, spec.Errorf(in.FromPos, "%s: %q is a step stage, and setup stages run before every step", what, in.From)
		case in.AtPhaseStart && p.Phase == n.Phase:
			return nil, spec.Errorf(in.FromPos, "%s: this input is read as it is when the %s starts, and %q writes it during the %s", what, n.Phase, in.From, n.Phase)
		}
		return edge(p)
	}
	var same, before []*Node
	for _, p := range g.nodes {
		if p == n || p.producesType(in.Type) == "" {
			continue
		}
		switch {
		case p.Phase == n.Phase:
			same = append(same, p)
		case earlier(p):
			before = append(before, p)
		}
	}
	cands := same
	if in.AtPhaseStart || len(same) == 0 {
		cands = before
	}
	switch len(cands) {
	case 1:
		return edge(cands[0])
	case 0:
		if src, ok := f.Sources[in.Type]; ok {
			return &Edge{Source: src, Out: in.Type, To: n, In: in.Name, Type: in.Type}, nil
		}
		if in.Optional {
			return nil, nil
		}
		msg := fmt.Sprintf("%s: no stage produces it", what)
		if len(same) > 0 && in.AtPhaseStart {
			msg = fmt.Sprintf("%s: it is read as it is when the %s starts, and no earlier stage produces it", what, n.Phase)
		}
		if f.Hint != nil {
			if h := f.Hint(in.Type); h != "" {
				msg += " (" + h + ")"
			}
		}
		return nil, spec.Errorf(n.Stage.UsesPos, "%s", msg)
	}
	names := make([]string, len(cands))
	for i, c := range cands {
		names[i] = fmt.Sprintf("%q", c.Stage.ID)
	}
	return nil, spec.Errorf(n.Stage.UsesPos, "%s: %d stages produce it (%s); name one with `with: {%s: ID}`", what, len(cands), strings.Join(names, ", "), in.Name)
}

// outputList lists a node's outputs as "name (type)".
func outputList(n *Node) string {
	if len(n.Ports.Out) == 0 {
		return "none"
	}
	var parts []string
	for _, p := range n.Ports.Out {
		parts = append(parts, fmt.Sprintf("%s (%s)", p.Name, p.Type))
	}
	return strings.Join(parts, ", ")
}

// Edges returns every data edge, in the order of the consumers' phases and
// topological order, then their inputs' order.
func (g *Graph) Edges() []*Edge {
	var out []*Edge
	for _, p := range g.phases() {
		for _, n := range p.nodes {
			out = append(out, n.Inputs...)
		}
	}
	return out
}

// CheckWhen evaluates every stage's `when` at validate time, over the steps
// 1..steps for step stages and at step 0 for setup stages, and reports:
// expressions that fail to evaluate (a run-time error at the first step
// where they do), and every data edge whose consumer can run at a step
// where its producer does not (it would read a value the producer did not
// write that step). env gives the environment of a stage at a step.
func (g *Graph) CheckWhen(steps int, env func(n *Node, step int) *spec.Env) spec.Errors {
	var errs spec.Errors
	// runs[n][s] says whether n runs at step s (index 0 for setup); a
	// stage with no when runs at every step and is not evaluated.
	runs := map[*Node][]bool{}
	failed := map[*Node]bool{}
	evaluate := func(n *Node) {
		lo, hi := 1, steps
		if n.Phase == spec.Setup {
			lo, hi = 0, 0
		}
		r := make([]bool, hi+1)
		for s := lo; s <= hi; s++ {
			ok, err := active(n, env(n, s))
			if err != nil {
				pos, msg := n.Stage.Pos, err.Error()
				var se *spec.Error
				if errors.As(err, &se) {
					pos, msg = se.Pos, se.Msg
				}
				errs.Addf(pos, "stage %q, when at step %d: %s", n.Stage.ID, s, msg)
				failed[n] = true
				return
			}
			r[s] = ok
		}
		runs[n] = r
	}
	for _, n := range g.nodes {
		if n.Stage.When != nil {
			evaluate(n)
		}
	}
	// runsAt says whether n runs at step s; a setup stage runs (or not)
	// before every step.
	runsAt := func(n *Node, s int) bool {
		if n.Stage.When == nil {
			return true
		}
		if n.Phase == spec.Setup {
			s = 0
		}
		return runs[n][s]
	}
	for _, n := range g.nodes {
		if failed[n] {
			continue
		}
		for _, e := range n.Inputs {
			if e.From == nil || e.From.Stage.When == nil || failed[e.From] {
				continue // a source or a producer that always runs
			}
			lo, hi := 1, steps
			if n.Phase == spec.Setup {
				lo, hi = 0, 0
			}
			for s := lo; s <= hi; s++ {
				if !runsAt(n, s) || runsAt(e.From, s) {
					continue
				}
				pos, cond := n.Stage.Pos, "it has no when"
				if n.Stage.When != nil {
					pos, cond = n.Stage.When.Pos, "when: "+n.Stage.When.Src
				}
				errs.Addf(pos, "stage %q reads %s.%s, but at step %d %q does not run (when: %s) and %q does (%s)",
					n.Stage.ID, e.From.Stage.ID, e.Out, s, e.From.Stage.ID, e.From.Stage.When.Src, n.Stage.ID, cond)
				break
			}
		}
	}
	return errs
}

// linkDependents lists in every node's Dependents, in file order and once
// each, the nodes that run after it for any reason.
func (g *Graph) linkDependents() {
	for _, n := range g.nodes {
		n.Dependents = nil
	}
	for _, n := range g.nodes {
		seen := map[*Node]bool{}
		for _, d := range n.deps {
			if !seen[d.on] {
				seen[d.on] = true
				d.on.Dependents = append(d.on.Dependents, n)
			}
		}
	}
	for _, n := range g.nodes {
		sort.SliceStable(n.Dependents, func(i, j int) bool { return n.Dependents[i].file < n.Dependents[j].file })
	}
}
