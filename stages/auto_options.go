package stages

import (
	"fmt"
	"slices"
	"strings"

	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
)

// apply_fsdp2's gather_once, accumulate_grads_on_device, overlap_reduce
// and replicate are auto by default. None changes a bit of what a step
// computes; each buys time with device memory. After the recompute and chunk choices,
// planning turns them on, model by model in the order of the apply_fsdp2
// stages, where they would save time and the job still fits:
//
//   - gather_once where the model's gathers cross PCIe (offloaded params)
//     or the ranks (a mesh of several), and some stage computing with it
//     would gather each unit in each of several micro-batches: a train
//     stage whose updates may have several, or a log-prob stage whose
//     steps may. An update of one micro-batch is not reason enough,
//     though its backward gathers again (reshard_after_forward): on an
//     H100 and an H200 that gather hid behind the backward, and keeping
//     the units saved no time (docs/performance.md);
//   - accumulate_grads_on_device where the model's optimizer state is
//     offloaded and its updates may have several micro-batches;
//   - overlap_reduce where a train stage trains the model over several
//     ranks without context parallelism, its params and optimizer state
//     on the device: the reduce-scatter of each unit's grads then runs on
//     the gather stream beside the next unit's backward instead of on the
//     compute stream (on two and four H200s, 0.4-2.7% more tokens a
//     second, docs/performance.md). It is not chosen with mesh.cp > 1 or
//     offloaded params, where it has not been measured.
//
//   - replicate where a frozen model (the ref) is computed with over
//     several ranks, its params on the device, mesh.cp 1, and no step
//     stage but update_ref writes it: every rank holds it whole and reads
//     its units in place, with no all-gather (on two and four H200s,
//     ref_logprob 3.5-5.4% more tokens a second, docs/performance.md). It is decided before the model's
//     gather_once, which a replica does not need; a gather_once would keep
//     every gathered unit, as many bytes as the replica, and still gather
//     each once a step.
//
// A model has at most two of them: accumulate_grads_on_device needs an
// offloaded optimizer, which overlap_reduce does not take, and a frozen
// model has only replicate and gather_once, which are decided in turn.
// Both are taken if the job fits with both; otherwise the one of them
// whose plan is smaller, if it fits. They never cost a recomputed layer or a smaller
// chunk: those are chosen first, with all off.

// fsdpOptions are what planning chose for one model's auto options.
type fsdpOptions struct {
	gatherOnce, accumulateGrads, overlapReduce, replicate bool
}

// fsdpOption is one of apply_fsdp2's auto options of model as it runs: as
// written (a), or what planning chose (the field of fsdpOptions that
// chosen reads).
func (j *Job) fsdpOption(a spec.AutoBool, model string, chosen func(fsdpOptions) bool) (bool, error) {
	if !a.IsAuto() {
		return a.IsTrue(), nil
	}
	if j.auto == nil {
		return false, errAutoUnplanned
	}
	return chosen(j.auto.options[model]), nil
}

// autoOption is one auto option of one model that planning decides.
type autoOption struct {
	key   string // the apply_fsdp2 key
	model string
	use   string // why it would save time; "" when it would not
	// unused says why it would not, where the option's own test said so
	// with use; "" leaves it to noUse.
	unused string
	set    func(o *fsdpOptions, on bool)
}

// autoOptions returns, in the order of the apply_fsdp2 stages, each
// model's auto options that apply to it, with what they would save.
// accumulate_grads_on_device applies only to a trained model whose
// optimizer state is offloaded, overlap_reduce only to a trained model
// whose optimizer state is not, replicate (first in its list) only to a
// frozen model on several ranks; gather_once to every model.
func (j *Job) autoOptions() [][]autoOption {
	var out [][]autoOption
	for _, st := range j.stagesOfKind("apply_fsdp2", nil) {
		s := j.Stages[st.ID].(*ApplyFSDP2)
		m := j.Models[s.Model]
		if m == nil {
			continue
		}
		var opts []autoOption
		if s.Replicate.IsAuto() && !m.Trainable && j.Spec.Mesh.WorldSize() > 1 {
			use, unused := j.replicateUse(m)
			opts = append(opts, autoOption{key: "replicate", model: s.Model, use: use, unused: unused,
				set: func(o *fsdpOptions, on bool) { o.replicate = on }})
		}
		if s.GatherOnce.IsAuto() {
			opts = append(opts, autoOption{key: "gather_once", model: s.Model, use: j.gatherOnceUse(m),
				set: func(o *fsdpOptions, on bool) { o.gatherOnce = on }})
		}
		if s.AccumulateGradsOnDevice.IsAuto() && m.Trainable && m.OffloadOptimizer {
			use := ""
			if j.severalMicroBatches(j.Spec.Data.GlobalBatchSize) {
				use = "an update may have several micro-batches, whose grads would each cross to the host and be added there"
			}
			opts = append(opts, autoOption{key: "accumulate_grads_on_device", model: s.Model, use: use,
				set: func(o *fsdpOptions, on bool) { o.accumulateGrads = on }})
		}
		if s.OverlapReduce.IsAuto() && m.Trainable && !m.OffloadOptimizer {
			use, unused := j.overlapReduceUse(m)
			opts = append(opts, autoOption{key: "overlap_reduce", model: s.Model, use: use, unused: unused,
				set: func(o *fsdpOptions, on bool) { o.overlapReduce = on }})
		}
		if len(opts) > 0 {
			out = append(out, opts)
		}
	}
	return out
}

// replicated reports whether model name is replicated over several
// ranks: written so, or chosen so by planning.
func (j *Job) replicated(name string) bool {
	w, err := j.shardWorld(name)
	return err == nil && w == 1 && j.Spec.Mesh.WorldSize() > 1
}

// gatherOnceUse says what gather_once would save model m: the stages that
// may gather its units in each of several micro-batches, when its gathers
// leave the device; "" when it would save nothing worth its memory.
func (j *Job) gatherOnceUse(m *Model) string {
	var from string
	switch w := j.Spec.Mesh.WorldSize(); {
	case j.replicated(m.Name()):
		return ""
	case m.Offload:
		from = "over PCIe"
	case w > 1:
		from = fmt.Sprintf("from %d ranks", w)
	default:
		return ""
	}
	var again []string
	for _, st := range j.Order {
		switch x := j.Stages[st.ID].(type) {
		case *Train:
			if x.Model == m.Name() && j.severalMicroBatches(j.Spec.Data.GlobalBatchSize) {
				again = append(again, fmt.Sprintf("%s in each micro-batch of an update", st.ID))
			}
		case logProbStage:
			if x.logProb().Model == m.Name() && j.severalMicroBatches(j.Spec.Data.RolloutSamples()) {
				again = append(again, fmt.Sprintf("%s in each micro-batch of a step", st.ID))
			}
		}
	}
	if len(again) == 0 {
		return ""
	}
	return fmt.Sprintf("its units are gathered %s by %s", from, strings.Join(again, ", "))
}

// overlapReduceUse says what overlap_reduce would save trained model m
// (use: the train stages that reduce-scatter its grads over several
// ranks) or why it is not chosen (unused): one rank, no train stage, or
// context parallelism or offloaded params, where it has not been
// measured.
func (j *Job) overlapReduceUse(m *Model) (use, unused string) {
	w := j.Spec.Mesh.WorldSize()
	switch {
	case w == 1:
		return "", "one rank: its grads are not reduced"
	case j.Spec.Mesh.CPSize() > 1:
		return "", "not chosen with context parallelism (mesh.cp > 1), where it has not been measured; write true to use it"
	case m.Offload:
		return "", "not chosen with offloaded params, whose uploads share the gather stream, where it has not been measured; write true to use it"
	}
	var by []string
	for _, st := range j.Order {
		if x, ok := j.Stages[st.ID].(*Train); ok && x.Model == m.Name() {
			by = append(by, st.ID)
		}
	}
	if len(by) == 0 {
		return "", "no train stage trains it"
	}
	return fmt.Sprintf("%s reduce-scatters its grads over %d ranks after each unit's backward, which the reduction would overlap", strings.Join(by, ", "), w), ""
}

// severalMicroBatches reports whether n samples over the dp ranks may need
// more than one micro-batch on a rank: a rank's share, of up to
// data.max_seq_len tokens each, against the rows of the smallest
// micro-batch a pack stage makes. Only the data decides how many there are.
func (j *Job) severalMicroBatches(n int) bool {
	m := j.Spec.Mesh
	dp := max(m.DP, 1)
	rows := 0
	for _, st := range j.Order {
		if pk, ok := j.Stages[st.ID].(*Pack); ok {
			if t := pk.Tokens(j.Spec); rows == 0 || t < rows {
				rows = t
			}
		}
	}
	if rows == 0 {
		rows = j.Spec.Data.MaxTokensPerGPU
	}
	return (n+dp-1)/dp*spec.SeqRows(j.Spec.Data.MaxSeqLen, m.CPSize()) > rows
}

// chooseOptions decides each model's auto options (autoOptions) against
// the budget, on top of the choices made so far. A frozen model's
// replicate comes first and alone: a replica gathers nothing, so its
// gather_once is then false, untried.
func (s *search) chooseOptions(all [][]autoOption) ([]plan.Choice, error) {
	var out []plan.Choice
	for _, opts := range all {
		if opts[0].key == "replicate" {
			c, err := s.chooseModelOptions(opts[:1])
			if err != nil {
				return nil, err
			}
			out = append(out, c...)
			if opts = opts[1:]; len(opts) == 0 {
				continue
			}
			if s.j.replicated(opts[0].model) {
				for _, o := range opts {
					out = append(out, plan.Choice{Key: o.key, Subject: "model " + o.model, Value: "false", Why: o.noUse(s.j)})
				}
				continue
			}
		}
		c, err := s.chooseModelOptions(opts)
		if err != nil {
			return nil, err
		}
		out = append(out, c...)
	}
	return out, nil
}

// chooseModelOptions decides one model's auto options opts: those that
// would save transfers, all of them if the job fits with all, else (of
// two) the one whose plan is smaller, if it fits. It leaves the search at
// the plan of the choice and returns a choice per option, in opts' order.
func (s *search) chooseModelOptions(opts []autoOption) ([]plan.Choice, error) {
	name := opts[0].model
	var useful []autoOption
	for _, o := range opts {
		if o.use != "" {
			useful = append(useful, o)
		}
	}
	base, err := s.plan()
	if err != nil {
		return nil, err
	}
	// The model's options decided before these (replicate) stay as chosen.
	prior := s.a.options[name]
	for _, x := range opts {
		x.set(&prior, false)
	}
	tried := map[fsdpOptions]*plan.Plan{prior: base} // the plans of the sets tried, each planned once
	try := func(on ...autoOption) (*plan.Plan, error) {
		o := prior
		for _, x := range on {
			x.set(&o, true)
		}
		s.a.options[name], s.cur = o, tried[o]
		p, err := s.plan()
		tried[o] = p
		return p, err
	}
	fits := func(p *plan.Plan) bool { return p.DeviceTotal() <= s.budget }
	var chosen []autoOption
	need := map[string]int64{} // by key: the device total with the option alone
	var all *plan.Plan         // the plan with every useful option on
	if len(useful) > 0 {
		all, err = try(useful...)
		if err != nil {
			return nil, err
		}
		if fits(all) {
			chosen = useful
		} else {
			for _, o := range useful {
				p, err := try(o)
				if err != nil {
					return nil, err
				}
				if need[o.key] = p.DeviceTotal(); fits(p) && (chosen == nil || need[o.key] < need[chosen[0].key]) {
					chosen = []autoOption{o}
				}
			}
		}
	}
	p, err := try(chosen...)
	if err != nil {
		return nil, err
	}
	s.cur = p
	budget := plan.GiB(s.budget)
	var out []plan.Choice
	for _, o := range opts {
		c := plan.Choice{Key: o.key, Subject: "model " + name, Value: "false"}
		on := slices.ContainsFunc(chosen, func(x autoOption) bool { return x.key == o.key })
		switch {
		case o.use == "":
			c.Why = o.noUse(s.j)
		case on && p.DeviceTotal() == base.DeviceTotal():
			c.Value = "true"
			c.Why = fmt.Sprintf("%s; it adds nothing to the job's peak: %s of %s GiB", o.use, plan.GiB(p.DeviceTotal()), budget)
		case on:
			c.Value = "true"
			with, without := "it", "without"
			for _, x := range chosen {
				if x.key != o.key {
					with, without = "it and "+x.key, "without either"
				}
			}
			was := plan.GiB(base.DeviceTotal()) + " " + without
			if plan.GiB(base.DeviceTotal()) == plan.GiB(p.DeviceTotal()) {
				// The GiB figures round alike: say what it adds.
				was = fmt.Sprintf("%.1f MiB more than %s", float64(p.DeviceTotal()-base.DeviceTotal())/(1<<20), without)
			}
			c.Why = fmt.Sprintf("%s; with %s the job needs %s of %s GiB (%s)", o.use, with, plan.GiB(p.DeviceTotal()), budget, was)
		case chosen != nil:
			c.Why = fmt.Sprintf("%s, but with both options the job would need %s of %s GiB", o.use, plan.GiB(all.DeviceTotal()), budget)
		default:
			c.Why = fmt.Sprintf("%s, but with it the job would need %s of %s GiB", o.use, plan.GiB(need[o.key]), budget)
		}
		out = append(out, c)
	}
	return out, nil
}

// noUse says why option o would save model o.model nothing.
func (o autoOption) noUse(j *Job) string {
	if o.unused != "" {
		return o.unused
	}
	if o.key == "accumulate_grads_on_device" {
		return "an update has one micro-batch: a rank's share of data.global_batch_size fits in one"
	}
	m := j.Models[o.model]
	if j.replicated(o.model) {
		return "the model is replicated: its units are read in place, not gathered"
	}
	if !m.Offload && j.Spec.Mesh.WorldSize() == 1 {
		return "its gathers stay on the device: one rank, params on the device"
	}
	return "no stage computing with it may have several micro-batches a step or an update"
}
