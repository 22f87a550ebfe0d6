// Package runtime turns the stages of a spec into a validated dependency
// graph, orders and executes them, and renders the graph for people (text,
// DOT) and programs (JSON).
package runtime

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/rlpipe/rlpipe/spec"
)

// Node is one stage of the graph.
type Node struct {
	Stage *spec.Stage
	// Phase is the phase the stage was declared in (stages.setup or
	// stages.step).
	Phase spec.Phase
	// Needs are the stages this one runs after, in declaration order. A step
	// stage may need setup stages; those are satisfied before the step phase
	// starts.
	Needs []*Node
	// Dependents are the stages that run after this one (they need it, read
	// its outputs, or write a state it reads as at the phase start), in file
	// order.
	Dependents []*Node
	// Ports are the data inputs and outputs the stage declares.
	Ports Ports
	// Inputs are the data edges into the stage, in the order of its inputs;
	// Outputs the edges out of it.
	Inputs, Outputs []*Edge
	// Index is the position of the node in the topological order of its
	// phase, starting at 0.
	Index int

	file int   // position among all stages in file order: setup first, then step
	deps []dep // why the stage runs after others: needs, data, state
}

// ID returns the id of the node's stage.
func (n *Node) ID() string { return n.Stage.ID }

// Graph is the validated dependency graph of a spec's stages.
type Graph struct {
	nodes []*Node // file order: setup stages, then step stages
	byID  map[string]*Node
	setup []*Node // topological order
	step  []*Node // topological order
}

// NewGraph builds the graph of the setup and step stages of s from their
// needs alone; see Build.
func NewGraph(s *spec.Spec) (*Graph, error) { return Build(s, nil) }

// Build builds the graph of the setup and step stages of s. The stages run
// after the stages they need and, when f is not nil, after the stages whose
// outputs they read (the data edges f's ports imply) and before the stages
// that write a state they read as it is when the phase starts. Build
// reports every problem it finds, not only the first, each at the position
// of the offending YAML: duplicate ids, needs naming unknown stages, a
// stage needing itself, a setup stage needing a step stage, inputs with no
// producer or an ambiguous one, and every dependency cycle (a producer
// that would have to run after its consumer is one). The error is a
// spec.Errors sorted by position.
func Build(s *spec.Spec, f *Flow) (*Graph, error) {
	if s == nil {
		return nil, spec.Errors{{Msg: "no spec"}}
	}
	var errs spec.Errors
	g := &Graph{byID: map[string]*Node{}}

	// Nodes, in file order; duplicates are reported and left out.
	var all []*Node // every non-nil stage, duplicates included, for needs checks
	add := func(stages []*spec.Stage, phase spec.Phase) {
		for i, st := range stages {
			if st == nil {
				errs.Addf(spec.Pos{File: s.File}, "stages.%s[%d] is empty", phase, i)
				continue
			}
			n := &Node{Stage: st, Phase: phase, file: len(all)}
			all = append(all, n)
			if st.ID == "" {
				errs.Addf(st.Pos, "%s stage has no id", phase)
				continue
			}
			if first, ok := g.byID[st.ID]; ok {
				errs.Addf(st.Pos, "duplicate stage id %q (first defined at %s)", st.ID, first.Stage.Pos)
				continue
			}
			g.byID[st.ID] = n
			g.nodes = append(g.nodes, n)
		}
	}
	add(s.Setup, spec.Setup)
	add(s.Step, spec.Step)

	// Edges. Needs of duplicate stages are checked too, so that every bad
	// reference is reported, but only the kept nodes get edges. Walking the
	// stages in file order leaves every Dependents list in file order.
	ids := make([]string, 0, len(g.nodes))
	for _, n := range g.nodes {
		ids = append(ids, n.Stage.ID)
	}
	for _, n := range all {
		kept := n.Stage.ID != "" && g.byID[n.Stage.ID] == n
		seen := map[string]bool{}
		for _, ref := range n.Stage.Needs {
			if seen[ref.Name] {
				errs.Addf(ref.Pos, "stage %q lists %q in needs more than once", n.Stage.ID, ref.Name)
				continue
			}
			seen[ref.Name] = true
			d, ok := g.byID[ref.Name]
			switch {
			case ref.Name == n.Stage.ID && n.Stage.ID != "":
				errs.Addf(ref.Pos, "stage %q needs itself", ref.Name)
			case !ok:
				msg := fmt.Sprintf("stage %q needs unknown stage %q", n.Stage.ID, ref.Name)
				if sug := suggest(ref.Name, ids); sug != "" {
					msg += fmt.Sprintf("; did you mean %q?", sug)
				}
				errs.Addf(ref.Pos, "%s", msg)
			case n.Phase == spec.Setup && d.Phase == spec.Step:
				errs.Addf(ref.Pos, "setup stage %q needs step stage %q, but setup stages run before any step stage", n.Stage.ID, ref.Name)
			case kept:
				n.Needs = append(n.Needs, d)
				n.deps = append(n.deps, dep{on: d, kind: depNeeds, pos: ref.Pos})
			}
		}
	}
	errs = append(errs, g.flow(f)...)
	g.linkDependents()
	errs = append(errs, cycles(g.nodes)...)
	if err := errs.Err(); err != nil {
		return nil, err
	}
	g.setup = g.topo(spec.Setup)
	g.step = g.topo(spec.Step)
	return g, nil
}

// Nodes returns every node in file order: setup stages, then step stages.
func (g *Graph) Nodes() []*Node {
	return append([]*Node(nil), g.nodes...)
}

// Node returns the node of the stage with the given id, or nil.
func (g *Graph) Node(id string) *Node { return g.byID[id] }

// Order returns the stages of a phase in topological order: every stage comes
// after the stages it needs, and ties are broken by file order. It returns
// nil for an unknown phase.
func (g *Graph) Order(phase spec.Phase) []*Node {
	switch phase {
	case spec.Setup:
		return append([]*Node(nil), g.setup...)
	case spec.Step:
		return append([]*Node(nil), g.step...)
	}
	return nil
}

// Active reports whether the stage of n runs with env: true when it has no
// `when`, otherwise the value of its `when` expression. When env leaves the
// stage fields empty they are filled from n. A nil env means the zero Env.
func (g *Graph) Active(n *Node, env *spec.Env) (bool, error) {
	if n == nil || n.Stage == nil {
		return false, fmt.Errorf("no stage")
	}
	ok, err := active(n, env)
	if err != nil {
		return false, fmt.Errorf("stage %q: %w", n.Stage.ID, err)
	}
	return ok, nil
}

// active evaluates the `when` of n; its errors do not name the stage.
func active(n *Node, env *spec.Env) (bool, error) {
	if n.Stage.When == nil {
		return true, nil
	}
	var e spec.Env
	if env != nil {
		e = *env
	}
	if e.Stage == (spec.StageEnv{}) {
		e.Stage = spec.StageEnv{ID: n.Stage.ID, Kind: n.Stage.Uses}
	}
	ok, err := n.Stage.When.Bool(&e)
	if err != nil {
		return false, fmt.Errorf("when: %w", err)
	}
	return ok, nil
}

// topo orders the nodes of one phase with Kahn's algorithm; among the stages
// ready to run, the one first in the file goes first. Needs on stages of
// another phase do not count: they are satisfied before the phase starts.
func (g *Graph) topo(phase spec.Phase) []*Node {
	indeg := map[*Node]int{}
	var ready []*Node
	for _, n := range g.nodes {
		if n.Phase != phase {
			continue
		}
		for _, d := range n.after() {
			if d.Phase == phase {
				indeg[n]++
			}
		}
		if indeg[n] == 0 {
			ready = append(ready, n)
		}
	}
	var order []*Node
	for len(ready) > 0 {
		// ready is kept sorted by file order; take the first.
		n := ready[0]
		ready = ready[1:]
		n.Index = len(order)
		order = append(order, n)
		for _, d := range n.Dependents {
			if d.Phase != phase {
				continue
			}
			indeg[d]--
			if indeg[d] == 0 {
				i := sort.Search(len(ready), func(i int) bool { return ready[i].file > d.file })
				ready = append(ready, nil)
				copy(ready[i+1:], ready[i:])
				ready[i] = d
			}
		}
	}
	return order
}

// after returns the distinct stages n runs after, in the order of its deps.
func (n *Node) after() []*Node {
	var out []*Node
	seen := map[*Node]bool{}
	for _, d := range n.deps {
		if !seen[d.on] {
			seen[d.on] = true
			out = append(out, d.on)
		}
	}
	return out
}

// cycles finds the strongly connected components of the dependency graph
// (needs, data edges and state ordering) with Tarjan's algorithm and
// reports one cycle through each component of more than one node.
// Self-needs have no edge; they are reported separately.
func cycles(nodes []*Node) spec.Errors {
	var (
		index   = map[*Node]int{}
		low     = map[*Node]int{}
		onStack = map[*Node]bool{}
		stack   []*Node
		comps   [][]*Node
		next    int
	)
	var connect func(n *Node)
	connect = func(n *Node) {
		index[n] = next
		low[n] = next
		next++
		stack = append(stack, n)
		onStack[n] = true
		for _, d := range n.after() {
			if _, seen := index[d]; !seen {
				connect(d)
				low[n] = min(low[n], low[d])
			} else if onStack[d] {
				low[n] = min(low[n], index[d])
			}
		}
		if low[n] == index[n] {
			var comp []*Node
			for {
				top := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				onStack[top] = false
				comp = append(comp, top)
				if top == n {
					break
				}
			}
			if len(comp) > 1 {
				comps = append(comps, comp)
			}
		}
	}
	for _, n := range nodes {
		if _, seen := index[n]; !seen {
			connect(n)
		}
	}

	var errs spec.Errors
	for _, comp := range comps {
		in := map[*Node]bool{}
		start := comp[0]
		for _, n := range comp {
			in[n] = true
			if n.file < start.file {
				start = n
			}
		}
		links := cyclePath(start, in)
		names := []string{start.Stage.ID}
		var why []string
		onlyNeeds := true
		pos := start.Stage.Pos
		posSet := false
		from := start
		for _, l := range links {
			names = append(names, l.on.Stage.ID)
			why = append(why, l.describe(from))
			if l.kind != depNeeds {
				onlyNeeds = false
			} else if !posSet {
				pos, posSet = l.pos, true
			}
			from = l.on
		}
		reason := "each stage needs the next"
		if !onlyNeeds {
			reason = strings.Join(why, "; ")
		}
		errs.Addf(pos, "dependency cycle: %s (%s)", strings.Join(names, " -> "), reason)
	}
	return errs
}

// cyclePath returns the links of a shortest cycle start -> ... -> start
// that stays inside the component in; link k leads from the k-th stage of
// the cycle to the next, which it runs after.
func cyclePath(start *Node, in map[*Node]bool) []dep {
	type step struct {
		from *Node
		link dep
	}
	prev := map[*Node]step{}
	queue := []*Node{start}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		for _, d := range n.deps {
			if !in[d.on] {
				continue
			}
			if d.on == start {
				links := []dep{d}
				for m := n; m != start; m = prev[m].from {
					links = append(links, prev[m].link)
				}
				slices.Reverse(links)
				return links
			}
			if _, seen := prev[d.on]; !seen && d.on != start {
				prev[d.on] = step{from: n, link: d}
				queue = append(queue, d.on)
			}
		}
	}
	// Unreachable for a strongly connected component.
	return nil
}

// suggest returns the id closest to name when it is likely a typo, or "".
func suggest(name string, ids []string) string { return spec.Closest(name, ids) }

// Sequence returns every stage in execution order: the setup stages in
// their topological order, then the step stages in theirs.
func (g *Graph) Sequence() []*spec.Stage {
	var out []*spec.Stage
	for _, ph := range []spec.Phase{spec.Setup, spec.Step} {
		for _, n := range g.Order(ph) {
			out = append(out, n.Stage)
		}
	}
	return out
}
