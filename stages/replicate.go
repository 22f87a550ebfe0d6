package stages

import (
	"fmt"
	"strings"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
)

// A frozen model replicated (apply_fsdp2's replicate) is held whole on
// every rank, laid out as one rank holds it. A copy of a sharded model
// gathers the source's shards (gatherReplica); another reads its whole
// checkpoint on every rank. The stages computing with it read its units
// in place instead of gathering them from the other ranks. Nothing it
// computes changes: the gathered unit and the replica hold the same
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

// gatherReplica declares op name, which copies sharded model from into
// replica to: parameter by parameter, each rank casts its rows to to's
// dtype (send), the ranks all-gather them (full, padded as in from's
// gathered layout), and the parameter's rows go into the replica. The
// values are those a gather of from computes with, and those reading the
// checkpoint from was loaded from gives to.
func gatherReplica(p *prog, from, to *ShardState, name string) {
	fn, tn := from.Model.Name(), to.Model.Name()
	if len(from.Units) != len(to.Units) {
		p.fail(fmt.Errorf("copying %s into %s: %d units against %d", fn, tn, len(from.Units), len(to.Units)))
		return
	}
	var shard, padded int64
	for _, u := range from.Units {
		for _, sl := range u.Slots {
			if !sl.Tied {
				shard, padded = max(shard, sl.ShardElems()), max(padded, sl.PaddedElems())
			}
		}
	}
	p.op(name)
	// F32, the widest dtype a frozen model stores: the buffers hold any.
	send := p.buf(p.stage.ID+".send", plan.Comm, gpu.F32, int(shard))
	full := p.buf(p.stage.ID+".full", plan.Comm, gpu.F32, int(padded))
	p.do(func() error {
		b := p.r.B
		for i, u := range from.Units {
			v := to.Units[i]
			for _, sl := range u.Slots {
				if sl.Tied {
					continue // the embedding's unit holds it
				}
				k := slotIndex(v, sl.Name)
				if k < 0 {
					return fmt.Errorf("copying %s into %s: the replica's unit %s has no %s", fn, tn, v.Name, sl.Name)
				}
				src, err := from.paramShard(u, sl)
				if err != nil {
					return err
				}
				dst, err := to.paramShard(v, v.Slots[k])
				if err != nil {
					return err
				}
				snd, err := section(send.t, 0, v.Master, sl.ShardElems())
				if err != nil {
					return err
				}
				all, err := section(full.t, 0, v.Master, sl.PaddedElems())
				if err != nil {
					return err
				}
				if err := b.Copy(snd, src); err != nil {
					return fmt.Errorf("%s: %w", sl.Name, err)
				}
				if err := p.r.Comm.AllGather(p.ctx, all, snd); err != nil {
					return fmt.Errorf("%s: all-gather: %w", sl.Name, err)
				}
				rows, err := all.Flat(0, int(sl.Elems()))
				if err == nil {
					err = b.Copy(dst, rows)
				}
				if err != nil {
					return fmt.Errorf("%s: %w", sl.Name, err)
				}
			}
		}
		return nil
	})
}
