package stages

import (
	"fmt"
	"strings"

	"github.com/rlpipe/rlpipe/spec"
)

// A frozen model replicated (apply_fsdp2's replicate) is held whole on
// every rank, as one rank holds it: its units are laid out for one rank,
// every rank loads all of it, and the stages computing with it read its
// units in place instead of gathering them from the other ranks. Nothing
// it computes changes: the gathered unit and the replica hold the same
// values. It costs (world−1)/world of the model's bytes more on each rank
// and saves every all-gather of the model: on two and four H200s
// ref_logprob ran 3.5-5.4% faster (docs/performance.md).

// replicateUnsupported says why model m cannot be replicated, or "" when it
// can: it must be frozen (a replicated trained model would need its grads
// all-reduced), its params on the device (an offloaded one would cross
// PCIe whole on every rank), mesh.cp 1, and no step stage but update_ref
// (which gathers a sharded source into the replica) may write its weights.
func (j *Job) replicateUnsupported(m *Model) string {
	switch {
	case m.Trainable:
		return "a train stage trains it, and only a frozen model can be"
	case m.Offload:
		return "policies.offload puts its params in host memory"
	case j.Spec.Mesh.CPSize() > 1:
		return "mesh.cp is above 1, and context parallelism shards the model over its ranks too"
	}
	var writers []string
	for _, st := range j.Order {
		s := j.Stages[st.ID]
		if _, ok := s.(*UpdateRef); ok || st.Phase != spec.Step || s == nil {
			continue // update_ref gathers a sharded source into a replica
		}
		for _, p := range s.Ports(j.Spec).Out {
			if p.Type == TypeWeights(m.Name()) {
				writers = append(writers, st.ID)
			}
		}
	}
	if len(writers) > 0 {
		return fmt.Sprintf("step stage %s writes its weights", strings.Join(writers, ", "))
	}
	return ""
}

// replicateUse says what replicating model m would save (use), or why it
// is not chosen (unused): one rank, nothing computing with it, or what
// replicateUnsupported says.
func (j *Job) replicateUse(m *Model) (use, unused string) {
	w := j.Spec.Mesh.WorldSize()
	if w == 1 {
		return "", "one rank: the model is whole on it already"
	}
	if why := j.replicateUnsupported(m); why != "" {
		return "", why
	}
	var by []string
	for _, st := range j.Order {
		if x, ok := j.Stages[st.ID].(logProbStage); ok && x.logProb().Model == m.Name() {
			by = append(by, st.ID)
		}
	}
	if len(by) == 0 {
		return "", "no stage computes with it"
	}
	return fmt.Sprintf("%s would read its units in place instead of all-gathering them from %d ranks", strings.Join(by, ", "), w), ""
}

// shardWorld is the number of ranks model name is sharded over as it
// runs: 1 where it is replicated (as written, or as planning chose), else
// the mesh's world size.
func (j *Job) shardWorld(name string) (int, error) {
	for _, st := range j.stagesOfKind("apply_fsdp2", nil) {
		s := j.Stages[st.ID].(*ApplyFSDP2)
		if s.Model != name {
			continue
		}
		rep, err := j.fsdpOption(s.Replicate, name, func(o fsdpOptions) bool { return o.replicate })
		if err != nil {
			return 0, err
		}
		if rep {
			return 1, nil
		}
	}
	return j.Spec.Mesh.WorldSize(), nil
}
