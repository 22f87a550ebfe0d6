package stages

import (
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/runtime"
	"github.com/rlpipe/rlpipe/spec"
)

// TestValues checks the run-time store of stage outputs: a read returns
// what the producer wrote, a step's outputs are gone when the next step
// starts while setup's stay, a read of a value the producer did not write
// this step is an error naming it, an optional input with no producer
// reads as absent, and undeclared ports are errors.
func TestValues(t *testing.T) {
	s := &spec.Spec{File: "job.yaml",
		Setup: []*spec.Stage{{ID: "shard", Uses: "k", Phase: spec.Setup}},
		Step:  []*spec.Stage{{ID: "pack", Uses: "k", Phase: spec.Step}, {ID: "train", Uses: "k", Phase: spec.Step}},
	}
	ports := map[string]Ports{
		"shard": {Out: []Port{{Name: "weights", Type: "weights/actor"}}},
		"pack":  {Out: []Port{{Name: "batch", Type: TypeBatch}}},
		"train": {In: []Input{
			{Port: Port{Name: "batch", Type: TypeBatch}},
			{Port: Port{Name: "weights", Type: "weights/actor"}},
			{Port: Port{Name: "old", Type: TypeOldLogProbs}, Optional: true},
		}},
	}
	g, err := runtime.Build(s, &runtime.Flow{Ports: func(st *spec.Stage) Ports { return ports[st.ID] }})
	if err != nil {
		t.Fatal(err)
	}
	v := values{}
	train := g.Node("train")
	if err := v.out(g.Node("shard"), "weights", "W"); err != nil {
		t.Fatal(err)
	}
	if err := v.out(g.Node("pack"), "batch", "B1"); err != nil {
		t.Fatal(err)
	}
	if x, err := v.in(train, "batch"); err != nil || x != "B1" {
		t.Errorf("batch = %v, %v; want B1", x, err)
	}
	if x, err := v.in(train, "old"); err != nil || x != nil {
		t.Errorf("unfed optional input = %v, %v; want absent", x, err)
	}
	v.clearStep(g)
	if x, err := v.in(train, "weights"); err != nil || x != "W" {
		t.Errorf("after the step: weights = %v, %v; want setup's W", x, err)
	}
	if _, err := v.in(train, "batch"); err == nil || !strings.Contains(err.Error(), `pack wrote no batch this step`) {
		t.Errorf("reading last step's batch: %v; want an error naming pack", err)
	}
	if _, err := v.in(train, "nope"); err == nil {
		t.Error("reading an undeclared input is no error")
	}
	if err := v.out(train, "nope", 1); err == nil {
		t.Error("writing an undeclared output is no error")
	}
}
