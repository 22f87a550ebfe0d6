package runtime

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/rlpipe/rlpipe/spec"
)

// graphJSON is the document Graph.JSON writes.
type graphJSON struct {
	Nodes []nodeJSON `json:"nodes"`
	Edges []edgeJSON `json:"edges"`
	Data  []dataJSON `json:"data"`
}

// dataJSON is one data edge: output out of stage from (or a source) feeds
// input in of stage to.
type dataJSON struct {
	From   string `json:"from,omitempty"`
	Source string `json:"source,omitempty"`
	Out    string `json:"out"`
	To     string `json:"to"`
	In     string `json:"in"`
	Type   string `json:"type"`
}

type nodeJSON struct {
	ID    string     `json:"id"`
	Uses  string     `json:"uses"`
	Phase spec.Phase `json:"phase"`
	Order int        `json:"order"` // index in the topological order of the phase
	Needs []string   `json:"needs"`
	When  string     `json:"when,omitempty"` // source of the `when` expression
	Pos   string     `json:"pos"`
}

// edgeJSON points from a stage to a stage that needs it, the direction data
// and control flow.
type edgeJSON struct {
	From       string `json:"from"`
	To         string `json:"to"`
	CrossPhase bool   `json:"cross_phase,omitempty"` // a step stage needing a setup stage
}

// phases returns the phases with their ordered nodes, setup first.
func (g *Graph) phases() []struct {
	phase spec.Phase
	nodes []*Node
} {
	return []struct {
		phase spec.Phase
		nodes []*Node
	}{{spec.Setup, g.setup}, {spec.Step, g.step}}
}

// JSON renders the graph as an indented JSON document with a stable layout:
// "nodes" (id, uses, phase, order, needs, when, pos), setup stages then step
// stages, each phase in topological order; "edges" (from a stage to a
// stage that needs it, in node order then needs order); and "data" (the
// data edges, in consumer order then input order).
func (g *Graph) JSON() ([]byte, error) {
	doc := graphJSON{Nodes: []nodeJSON{}, Edges: []edgeJSON{}, Data: []dataJSON{}}
	for _, e := range g.Edges() {
		d := dataJSON{Source: e.Source, Out: e.Out, To: e.To.Stage.ID, In: e.In, Type: e.Type}
		if e.From != nil {
			d.From = e.From.Stage.ID
		}
		doc.Data = append(doc.Data, d)
	}
	for _, p := range g.phases() {
		for _, n := range p.nodes {
			nj := nodeJSON{
				ID:    n.Stage.ID,
				Uses:  n.Stage.Uses,
				Phase: n.Phase,
				Order: n.Index,
				Needs: []string{},
				Pos:   n.Stage.Pos.String(),
			}
			if n.Stage.When != nil {
				nj.When = n.Stage.When.Src
			}
			for _, d := range n.Needs {
				nj.Needs = append(nj.Needs, d.Stage.ID)
				doc.Edges = append(doc.Edges, edgeJSON{From: d.Stage.ID, To: n.Stage.ID, CrossPhase: d.Phase != n.Phase})
			}
			doc.Nodes = append(doc.Nodes, nj)
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // keep `when` sources such as "a && b" readable
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("graph json: %w", err)
	}
	return buf.Bytes(), nil
}

// DOT renders the graph in Graphviz DOT: one cluster per phase, a box per
// stage labelled with its id and kind, edges from a stage to the stages that
// need it (dotted from setup into step), each `when` as a dashed note
// attached to its stage, and the data edges in blue, labelled with their
// ports and type (sources as cylinders).
func (g *Graph) DOT() string {
	var b strings.Builder
	b.WriteString("digraph rlpipe {\n")
	b.WriteString("  rankdir=TB;\n")
	b.WriteString("  node [shape=box, fontname=\"Helvetica\"];\n")
	b.WriteString("  edge [fontname=\"Helvetica\"];\n")
	for _, p := range g.phases() {
		if len(p.nodes) == 0 {
			continue
		}
		fmt.Fprintf(&b, "  subgraph cluster_%s {\n", p.phase)
		fmt.Fprintf(&b, "    label=%s;\n", dotQuote(string(p.phase)))
		b.WriteString("    style=rounded;\n")
		for _, n := range p.nodes {
			fmt.Fprintf(&b, "    %s [label=%s];\n", dotQuote(n.Stage.ID), dotQuote(n.Stage.ID+"\n"+n.Stage.Uses))
			if n.Stage.When != nil {
				w := dotQuote("when:" + n.Stage.ID)
				fmt.Fprintf(&b, "    %s [label=%s, shape=note, style=dashed];\n", w, dotQuote("when: "+n.Stage.When.Src))
				fmt.Fprintf(&b, "    %s -> %s [style=dashed, arrowhead=odot];\n", w, dotQuote(n.Stage.ID))
			}
		}
		b.WriteString("  }\n")
	}
	for _, p := range g.phases() {
		for _, n := range p.nodes {
			for _, d := range n.Needs {
				attr := ""
				if d.Phase != n.Phase {
					attr = " [style=dotted]"
				}
				fmt.Fprintf(&b, "  %s -> %s%s;\n", dotQuote(d.Stage.ID), dotQuote(n.Stage.ID), attr)
			}
		}
	}
	sources := map[string]bool{}
	for _, e := range g.Edges() {
		if e.From == nil && !sources[e.Source] {
			sources[e.Source] = true
			fmt.Fprintf(&b, "  %s [shape=cylinder];\n", dotQuote(e.Source))
		}
		label := e.Type
		if e.In != e.Out {
			label = e.Out + " -> " + e.In + "\n" + e.Type
		}
		fmt.Fprintf(&b, "  %s -> %s [color=blue, fontcolor=blue, label=%s];\n", dotQuote(e.FromName()), dotQuote(e.To.Stage.ID), dotQuote(label))
	}
	b.WriteString("}\n")
	return b.String()
}

// dotQuote returns s as a DOT double-quoted string; newlines become the DOT
// line break \n.
func dotQuote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\r", "")
	return `"` + r.Replace(s) + `"`
}

// Text renders the graph for a terminal: each phase with its stages in
// execution order, their kinds, needs and `when`, then the data edges
// (producer.output -> consumer.input, and the type), then the order that
// reads of a state as it is when the phase starts impose.
func (g *Graph) Text() string {
	var b strings.Builder
	for _, p := range g.phases() {
		switch len(p.nodes) {
		case 0:
			fmt.Fprintf(&b, "%s: no stages\n", p.phase)
			continue
		case 1:
			fmt.Fprintf(&b, "%s: 1 stage\n", p.phase)
		default:
			fmt.Fprintf(&b, "%s: %d stages\n", p.phase, len(p.nodes))
		}
		var rows [][]string
		for _, n := range p.nodes {
			row := []string{fmt.Sprintf("%d.", n.Index+1), n.Stage.ID, n.Stage.Uses}
			var extra []string
			if len(n.Needs) > 0 {
				names := make([]string, len(n.Needs))
				for i, d := range n.Needs {
					names[i] = d.Stage.ID
					if d.Phase != n.Phase {
						names[i] += " (" + string(d.Phase) + ")"
					}
				}
				extra = append(extra, "needs "+strings.Join(names, ", "))
			}
			if n.Stage.When != nil {
				extra = append(extra, "when "+n.Stage.When.Src)
			}
			rows = append(rows, append(row, strings.Join(extra, "; ")))
		}
		b.WriteString(table("  ", rows))
	}
	if edges := g.Edges(); len(edges) > 0 {
		b.WriteString("data:\n")
		var rows [][]string
		for _, e := range edges {
			from := e.Source
			if e.From != nil {
				from = e.From.Stage.ID + "." + e.Out
				if e.From.Phase != e.To.Phase {
					from += " (" + string(e.From.Phase) + ")"
				}
			}
			typ := e.Type
			if in := e.To.inputPort(e.In); in.AtPhaseStart {
				typ += fmt.Sprintf(" (as it is when the %s starts)", e.To.Phase)
			}
			rows = append(rows, []string{from, "->", e.To.Stage.ID + "." + e.In, typ})
		}
		b.WriteString(table("  ", rows))
	}
	var order [][]string
	for _, p := range g.phases() {
		for _, n := range p.nodes {
			for _, d := range n.deps {
				if d.kind == depBefore {
					order = append(order, []string{d.on.Stage.ID, "before", n.Stage.ID, "(" + n.Stage.ID + " writes " + d.typ + ")"})
				}
			}
		}
	}
	if len(order) > 0 {
		b.WriteString("order:\n")
		b.WriteString(table("  ", order))
	}
	return b.String()
}

// table aligns rows into columns separated by two spaces, each line starting
// with indent and carrying no trailing spaces.
func table(indent string, rows [][]string) string {
	var widths []int
	for _, row := range rows {
		for i, cell := range row {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], len(cell))
		}
	}
	var b strings.Builder
	for _, row := range rows {
		line := indent
		for i, cell := range row {
			line += cell
			if i < len(row)-1 {
				line += strings.Repeat(" ", widths[i]-len(cell)+2)
			}
		}
		b.WriteString(strings.TrimRight(line, " "))
		b.WriteByte('\n')
	}
	return b.String()
}
