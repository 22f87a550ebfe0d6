package stages

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/rlpipe/rlpipe/runtime"
	"github.com/rlpipe/rlpipe/spec"
	"go.yaml.in/yaml/v3"
)

// Stages exchange data only through ports: a stage declares typed inputs
// and outputs (Stage.Ports), the graph connects every input to the one
// output of its type that feeds it (runtime.Build), and at run time a stage
// reads an input with In and writes an output with Out. A step's outputs
// are cleared when the step starts, so a read never sees another step's
// value; setup outputs (a model's checkpoint and weights) last the run.

// Port, Input and Ports are the graph's port declarations.
type (
	Port  = runtime.Port
	Input = runtime.Input
	Ports = runtime.Ports
)

// The types of the standard kinds' ports, and the Go type of their values.
const (
	// TypeRollouts is the step's rollout batch (*RolloutBatch). The job's
	// rollout file (data.rollouts) feeds it when no stage produces it.
	TypeRollouts = "rollouts"
	// TypePrompts is the step's prompts (*PromptBatch), which the job's
	// prompts file (data.prompts) feeds.
	TypePrompts = "prompts"
	// TypeBatch is a rollout batch prepared for the model (*Batch): pack's
	// output.
	TypeBatch = "batch"
	// TypeRefLogProbs and TypeOldLogProbs are per-token log-probs of the
	// batch (*TokenValues): the reference model's (ref_logprob) and the
	// actor's before the step's updates (actor_logprob).
	TypeRefLogProbs = "log_probs/ref"
	TypeOldLogProbs = "log_probs/old"
	// TypeRefEntropy and TypeOldEntropy are the per-token entropies
	// (*TokenValues) of the log-prob stages with entropy: true.
	TypeRefEntropy = "entropy/ref"
	TypeOldEntropy = "entropy/old"
)

// TypeCheckpoint is the type of model m's opened checkpoint (*Model):
// load_hf's output.
func TypeCheckpoint(m string) string { return "checkpoint/" + m }

// TypeWeights is the type of model m's sharded weights (*ShardState):
// apply_fsdp2 produces them, train and update_ref write them during a step.
func TypeWeights(m string) string { return "weights/" + m }

// TypePushed is the type of the HF checkpoint directory push_weights
// wrote of model m this step (its path, a string): what an engine loads.
func TypePushed(m string) string { return "pushed/" + m }

// The names of the job's data files as sources in the graph.
const (
	SourceRollouts = "data.rollouts"
	SourcePrompts  = "data.prompts"
)

// flow tells runtime.Build the ports of the job's decoded stages. An input
// named X takes its producer from the stage's `with: {X: ID}` when given.
func flow(s *spec.Spec, decoded map[string]Stage) *runtime.Flow {
	return &runtime.Flow{
		Ports: func(st *spec.Stage) Ports {
			stg := decoded[st.ID]
			if stg == nil {
				return Ports{}
			}
			p := stg.Ports(s)
			for i := range p.In {
				if n := withValue(st, p.In[i].Name); n != nil && n.Kind == yaml.ScalarNode {
					p.In[i].From, p.In[i].FromPos = n.Value, spec.NodePos(st.UsesPos.File, n)
				}
			}
			return p
		},
		Sources: map[string]string{TypeRollouts: SourceRollouts, TypePrompts: SourcePrompts},
		Hint:    hint,
	}
}

// withValue returns the value node of key in the stage's `with:` block.
func withValue(st *spec.Stage, key string) *yaml.Node {
	w := st.With
	if w == nil || w.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(w.Content); i += 2 {
		if w.Content[i].Value == key {
			return w.Content[i+1]
		}
	}
	return nil
}

// hint says how to produce typ, for the error of an input that nothing
// feeds: the standard kinds by name, and for other types the registered
// kinds whose default parameters declare an output of that type.
func hint(typ string) string {
	family, model, _ := strings.Cut(typ, "/")
	switch family {
	case "log_probs":
		return fmt.Sprintf("a %s_logprob stage produces it", map[string]string{"ref": "ref", "old": "actor"}[model])
	case "entropy":
		return fmt.Sprintf("a %s_logprob stage with entropy: true produces it", map[string]string{"ref": "ref", "old": "actor"}[model])
	case TypeBatch:
		return "a pack stage produces it"
	case "weights":
		return fmt.Sprintf("an apply_fsdp2 stage with model: %s produces it", model)
	case "checkpoint":
		return fmt.Sprintf("a load_hf stage with model: %s produces it", model)
	}
	var kinds []string
	for _, k := range Kinds() {
		for _, p := range k.New().Ports(&spec.Spec{}).Out {
			if p.Type == typ {
				kinds = append(kinds, k.Name)
				break
			}
		}
	}
	if len(kinds) == 0 {
		return ""
	}
	return "kinds that produce it: " + strings.Join(kinds, ", ")
}

// values holds the outputs stages wrote, by "stage.port" (or source name).
type values map[string]any

// key is the store key of the value an edge carries.
func key(e *runtime.Edge) string {
	if e.From == nil {
		return e.Source
	}
	return e.From.Stage.ID + "." + e.Out
}

// clearStep drops the outputs of the step stages of g.
func (v values) clearStep(g *runtime.Graph) {
	for _, n := range g.Order(spec.Step) {
		for _, p := range n.Ports.Out {
			delete(v, n.Stage.ID+"."+p.Name)
		}
	}
}

// in returns the value that feeds input name of node n, or nil with no
// error when the input is optional and unconnected.
func (v values) in(n *runtime.Node, name string) (any, error) {
	var decl *Input
	for i := range n.Ports.In {
		if n.Ports.In[i].Name == name {
			decl = &n.Ports.In[i]
		}
	}
	if decl == nil {
		return nil, fmt.Errorf("stage %q has no input %q", n.Stage.ID, name)
	}
	e := n.Input(name)
	if e == nil {
		return nil, nil // optional, with no producer
	}
	x, ok := v[key(e)]
	if !ok {
		return nil, fmt.Errorf("stage %q input %q: %s wrote no %s this step", n.Stage.ID, name, e.FromName(), e.Type)
	}
	return x, nil
}

// out records the value of output name of node n.
func (v values) out(n *runtime.Node, name string, x any) error {
	for _, p := range n.Ports.Out {
		if p.Name == name {
			v[n.Stage.ID+"."+name] = x
			return nil
		}
	}
	return fmt.Errorf("stage %q has no output %q", n.Stage.ID, name)
}

// In returns the value of the stage's input name: what its producer wrote
// this step (or during setup). A missing value is an error; an optional
// input with no producer gives the zero T and ok false.
func In[T any](rc *RunContext, name string) (v T, ok bool, err error) {
	x, err := rc.Rank.values.in(rc.Node, name)
	if err != nil || x == nil {
		return v, false, err
	}
	if st, ok := x.(*ShardState); ok {
		// A plugin reads the weights as it likes: after every unit's update.
		if err := st.settle(); err != nil {
			return v, false, err
		}
	}
	v, ok = x.(T)
	if !ok {
		return v, false, fmt.Errorf("stage %q input %q holds a %T, not a %v", rc.Stage.ID, name, x, reflect.TypeFor[T]())
	}
	return v, true, nil
}

// Out records the value of the stage's output name for the stages that
// read it.
func (rc *RunContext) Out(name string, v any) error { return rc.Rank.values.out(rc.Node, name, v) }
