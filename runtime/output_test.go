package runtime

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/name, rewriting the file under -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./runtime -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (rerun with -update if intended)\ngot:\n%s\nwant:\n%s", name, got, want)
	}
}

// grpoDefs is a GRPO pipeline: load and shard actor and ref once, then per
// step pack, log-probs, train, and refresh the ref every 10 steps.
var grpoDefs = []def{
	setup("load_actor", "load_hf"),
	setup("load_ref", "load_hf"),
	setup("shard_actor", "apply_fsdp2", "load_actor"),
	setup("shard_ref", "apply_fsdp2", "load_ref"),
	step("pack", "pack"),
	step("ref_lp", "ref_logprob", "pack", "shard_ref"),
	step("actor_lp", "actor_logprob", "pack", "shard_actor"),
	step("train", "train", "ref_lp", "actor_lp"),
	step("update_ref", "update_ref", "train").onlyWhen(`step > 0 && step % 10 == 0`),
}

func TestGraphOutput(t *testing.T) {
	tests := []struct {
		name   string
		defs   []def
		render func(*Graph) ([]byte, error)
	}{
		{"grpo.json", grpoDefs, (*Graph).JSON},
		{"grpo.dot", grpoDefs, func(g *Graph) ([]byte, error) { return []byte(g.DOT()), nil }},
		{"grpo.txt", grpoDefs, func(g *Graph) ([]byte, error) { return []byte(g.Text()), nil }},
		{"step_only.json", []def{step("train", "train")}, (*Graph).JSON},
		{"step_only.dot", []def{step("train", "train")}, func(g *Graph) ([]byte, error) { return []byte(g.DOT()), nil }},
		{"step_only.txt", []def{step("train", "train")}, func(g *Graph) ([]byte, error) { return []byte(g.Text()), nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := NewGraph(build(t, tt.defs...))
			if err != nil {
				t.Fatal(err)
			}
			got, err := tt.render(g)
			if err != nil {
				t.Fatal(err)
			}
			again, err := tt.render(g)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, again) {
				t.Errorf("output is not stable between calls")
			}
			golden(t, tt.name, got)
		})
	}
}

func TestGraphJSONShape(t *testing.T) {
	g, err := NewGraph(build(t, grpoDefs...))
	if err != nil {
		t.Fatal(err)
	}
	out, err := g.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Nodes []struct {
			ID    string   `json:"id"`
			Phase string   `json:"phase"`
			Order int      `json:"order"`
			Needs []string `json:"needs"`
		} `json:"nodes"`
		Edges []struct {
			From       string `json:"from"`
			To         string `json:"to"`
			CrossPhase bool   `json:"cross_phase"`
		} `json:"edges"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Nodes) != len(grpoDefs) {
		t.Errorf("%d nodes, want %d", len(doc.Nodes), len(grpoDefs))
	}
	needs := 0
	for _, n := range doc.Nodes {
		needs += len(n.Needs)
	}
	if len(doc.Edges) != needs {
		t.Errorf("%d edges, want one per need (%d)", len(doc.Edges), needs)
	}
	cross := 0
	for _, e := range doc.Edges {
		if e.CrossPhase {
			cross++
		}
	}
	if cross != 2 {
		t.Errorf("%d cross-phase edges, want 2", cross)
	}
}

func TestDOTQuote(t *testing.T) {
	tests := []struct{ in, want string }{
		{"train", `"train"`},
		{`a "b"`, `"a \"b\""`},
		{`back\slash`, `"back\\slash"`},
		{"two\nlines", `"two\nlines"`},
		{"", `""`},
	}
	for _, tt := range tests {
		if got := dotQuote(tt.in); got != tt.want {
			t.Errorf("dotQuote(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}
