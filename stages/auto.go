package stages

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
)

// autoChoices are the decisions a spec leaves to planning: the decoder
// layers each trained model recomputes under policies.recompute auto (the
// default), the log-prob chunk of each stage whose chunk_tokens is auto
// (the default), and apply_fsdp2's options left to auto (the default).
// Plan makes them and Run reads them: what the plan prints is what runs.
type autoChoices struct {
	recompute map[string]int         // by model: its decoder layers with index < n recompute
	lean      map[string]int         // by model: its decoder layers with index < n that do not recompute are lean
	chunks    map[string]int         // by stage id: the chunk's rows
	options   map[string]fsdpOptions // by model: apply_fsdp2's auto options (auto_options.go)
}

// errAutoUnplanned is returned where a decision left to planning is read
// before the job was planned.
var errAutoUnplanned = errors.New("internal error: the job was not planned, so its auto choices are not made")

// recomputeAuto reports whether unit u of model m recomputes under
// policies.recompute auto.
func (j *Job) recomputeAuto(m *Model, u model.Unit) (bool, error) {
	if j.auto == nil {
		return false, errAutoUnplanned
	}
	return u.Index < j.auto.recompute[m.Name()], nil
}

// lean reports whether decoder unit u of model m, where it does not
// recompute, keeps no element-wise activations in stage st
// (model.LayerActs.Lean), per policies.recompute_elementwise: its
// expression; under auto, what planning chose when policies.recompute is
// auto too, else false.
func (j *Job) lean(m *Model, u model.Unit, st *spec.Stage) (bool, error) {
	if u.Kind != model.UnitDecoder {
		return false, nil
	}
	if e := j.Spec.Policies.RecomputeElementwise; e != nil {
		return e.Bool(j.Env(m, &u, st))
	}
	if j.Spec.Policies.Recompute != nil {
		return false, nil
	}
	if j.auto == nil {
		return false, errAutoUnplanned
	}
	return u.Index < j.auto.lean[m.Name()], nil
}

// chunkTokens is stage id's log-prob chunk: the written one, or what
// planning chose for auto.
func (j *Job) chunkTokens(id string, c spec.AutoInt) (int, error) {
	if !c.IsAuto() {
		return int(c), nil
	}
	if j.auto == nil {
		return 0, errAutoUnplanned
	}
	n, ok := j.auto.chunks[id]
	if !ok {
		return 0, fmt.Errorf("internal error: no chunk chosen for stage %q", id)
	}
	return n, nil
}

// autoModels returns, under policies.recompute auto, the models that train
// stages update and their decoder layer counts.
func (j *Job) autoModels() map[string]int {
	layers := map[string]int{}
	if j.Spec.Policies.Recompute != nil {
		return layers
	}
	for _, st := range j.Order {
		t, ok := j.Stages[st.ID].(*Train)
		if !ok {
			continue
		}
		if m := j.Models[t.Model]; m != nil && m.Config != nil {
			layers[t.Model] = m.Config.NumLayers
		}
	}
	return layers
}

// autoChunkStages returns the ids of the stages whose chunk_tokens is auto,
// in order.
func (j *Job) autoChunkStages() []string {
	var ids []string
	for _, st := range j.Order {
		var c spec.AutoInt
		switch s := j.Stages[st.ID].(type) {
		case logProbStage:
			c = s.logProb().ChunkTokens
		case *Train:
			c = s.ChunkTokens
		default:
			continue
		}
		if c.IsAuto() {
			ids = append(ids, st.ID)
		}
	}
	return ids
}

// Plan builds the per-device memory plan of the job, first making the
// decisions the spec leaves to it: under policies.recompute auto the
// fewest decoder layers of each trained model recompute (layers 0 to k-1)
// such that the job fits the GPU, and then each stage with chunk_tokens
// auto gets the largest log-prob chunk (1024 doubled, up to the rows of a
// micro-batch) that still fits; last, apply_fsdp2's options left to auto
// (gather_once, accumulate_grads_on_device, overlap_reduce, replicate) are
// turned on where they save transfers and still fit (auto_options.go).
// Fewer recomputed layers save a forward per layer in the backward;
// larger chunks mean fewer, larger GEMMs and passes over the logits. The plan's Auto entries say what was
// chosen and why.
func Plan(j *Job) (*plan.Plan, error) {
	a := &autoChoices{recompute: map[string]int{}, lean: map[string]int{}, chunks: map[string]int{}, options: map[string]fsdpOptions{}}
	j.auto = a
	trained := j.autoModels()
	chunked := j.autoChunkStages()
	opts := j.autoOptions()
	if len(trained) == 0 && len(chunked) == 0 && len(opts) == 0 {
		return planOnce(j)
	}
	rows := cpRows(j)
	for _, id := range chunked {
		a.chunks[id] = min(DefaultChunkTokens, rows)
	}
	sr := &search{j: j, a: a, budget: j.GPU.Bytes}
	var choices []plan.Choice
	if len(trained) > 0 {
		c, err := sr.chooseRecompute(trained)
		if err != nil {
			return nil, err
		}
		choices = append(choices, c...)
	}
	for _, id := range chunked {
		c, err := sr.chooseChunk(id, rows)
		if err != nil {
			return nil, err
		}
		choices = append(choices, c)
	}
	if len(opts) > 0 {
		c, err := sr.chooseOptions(opts)
		if err != nil {
			return nil, err
		}
		choices = append(choices, c...)
	}
	p, err := sr.plan()
	if err != nil {
		return nil, err
	}
	p.Auto = choices
	return p, nil
}

// search makes the auto choices of a job against its GPU's budget. It
// keeps the plan of the choices as they stand, so that no state of them
// is planned twice.
type search struct {
	j      *Job
	a      *autoChoices
	budget int64
	cur    *plan.Plan // the plan of the choices as they stand; nil: not planned yet
}

// plan returns the plan of the choices as they stand.
func (s *search) plan() (*plan.Plan, error) {
	if s.cur == nil {
		p, err := planOnce(s.j)
		if err != nil {
			return nil, err
		}
		s.cur = p
	}
	return s.cur, nil
}

// chooseRecompute makes the recompute choices of the trained models. With
// policies.recompute_elementwise auto too, it first takes the fewest
// element-wise layers (layers 0 to l-1, none recomputing) with which the
// job's device total stays within budget: such a layer's backward reruns
// two RMSNorms and a SwiGLU, far less than a recomputed layer's forward,
// for about a third of its saved activations. When even every layer
// element-wise does not fit, every layer is, and the fewest recomputed
// layers (layers 0 to k-1) follow; with recompute_elementwise written,
// only those.
func (s *search) chooseRecompute(trained map[string]int) ([]plan.Choice, error) {
	most := 0
	for _, n := range trained {
		most = max(most, n)
	}
	autoLean := s.j.Spec.Policies.RecomputeElementwise == nil
	set := func(l, k int) {
		for name, n := range trained {
			s.a.lean[name], s.a.recompute[name] = min(l, n), min(k, n)
		}
	}
	at := map[[2]int]*plan.Plan{} // by (element-wise, recomputed) layers, the plans tried
	try := func(l, k int) (*plan.Plan, error) {
		if p, ok := at[[2]int{l, k}]; ok {
			return p, nil
		}
		set(l, k)
		s.cur = nil
		p, err := s.plan()
		if err != nil {
			return nil, err
		}
		at[[2]int{l, k}] = p
		return p, nil
	}
	l, k := 0, 0
	if autoLean {
		n, fits, err := s.fewest(most, func(n int) (*plan.Plan, error) { return try(n, 0) })
		if err != nil {
			return nil, err
		}
		if l = n; !fits {
			l = most
		}
	}
	if p, err := try(l, 0); err != nil {
		return nil, err
	} else if p.DeviceTotal() > s.budget {
		n, _, err := s.fewest(most, func(n int) (*plan.Plan, error) { return try(l, n) })
		if err != nil {
			return nil, err
		}
		k = n
	}
	p, err := try(l, k)
	if err != nil {
		return nil, err
	}
	set(l, k) // try may have answered from the plans tried
	s.cur = p
	return s.recomputeChoices(trained, autoLean, l, k, at), nil
}

// fewest returns the smallest n in [0, most] for which try's plan fits the
// budget, and whether one does; when none does, the n of the smallest
// total. It bisects over 1 to most-1, where a larger n frees more memory
// (one more of the first layers recomputing, or element-wise), and tries
// most on its own: the last layer's activations are read at once by the
// backward, so recomputing it saves only what the head holds while they
// would be kept. It also plans n-1, whose total the choice's reason
// quotes.
func (s *search) fewest(most int, try func(int) (*plan.Plan, error)) (int, bool, error) {
	fits := func(n int) (bool, error) {
		p, err := try(n)
		if err != nil {
			return false, err
		}
		return p.DeviceTotal() <= s.budget, nil
	}
	ok, err := fits(0)
	if err != nil || ok || most == 0 {
		return 0, ok, err
	}
	n, inner := 0, false
	if most > 1 {
		if inner, err = fits(most - 1); err != nil {
			return 0, false, err
		}
	}
	switch {
	case inner:
		lo, hi := 1, most-1
		for lo < hi {
			mid := (lo + hi) / 2
			f, err := fits(mid)
			if err != nil {
				return 0, false, err
			}
			if f {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		n, ok = lo, true
	default:
		if ok, err = fits(most); err != nil {
			return 0, false, err
		}
		n = most
		if !ok && most > 1 {
			a, err := try(most - 1)
			if err != nil {
				return 0, false, err
			}
			b, err := try(most)
			if err != nil {
				return 0, false, err
			}
			if a.DeviceTotal() < b.DeviceTotal() {
				n = most - 1
			}
		}
	}
	if _, err := try(n - 1); err != nil {
		return 0, false, err
	}
	return n, ok, nil
}

// layerRange names the first n of a model's total decoder layers.
func layerRange(n, total int) string {
	switch {
	case n == 0:
		return fmt.Sprintf("none of %d layers", total)
	case n >= total:
		return fmt.Sprintf("all %d layers", total)
	case n == 1:
		return fmt.Sprintf("layer 0 of %d", total)
	}
	return fmt.Sprintf("layers 0-%d of %d", n-1, total)
}

// recomputeChoices describes, per trained model, the layers that
// recompute (k) and, with recompute_elementwise auto, those that are
// element-wise (l), at holding the plans tried.
func (s *search) recomputeChoices(trained map[string]int, autoLean bool, l, k int, at map[[2]int]*plan.Plan) []plan.Choice {
	budget := plan.GiB(s.budget)
	total := func(l, k int) string { return plan.GiB(at[[2]int{l, k}].DeviceTotal()) }
	fits := at[[2]int{l, k}].DeviceTotal() <= s.budget
	names := make([]string, 0, len(trained))
	for name := range trained {
		names = append(names, name)
	}
	slices.Sort(names)
	var out []plan.Choice
	for _, name := range names {
		n := trained[name]
		rc := plan.Choice{Key: "policies.recompute", Subject: "model " + name, Value: layerRange(min(k, n), n)}
		switch {
		case !fits:
			rc.Why = fmt.Sprintf("the least memory, and the job still needs %s of %s GiB", total(l, k), budget)
		case k == 0 && l == 0:
			rc.Why = fmt.Sprintf("every layer's activations fit: %s of %s GiB", total(0, 0), budget)
		case k == 0:
			rc.Why = "the element-wise layers make it fit"
		case autoLean:
			rc.Why = fmt.Sprintf("the fewest that fit with every other layer element-wise: %s of %s GiB; %d would need %s", total(l, k), budget, k-1, total(l, k-1))
		default:
			rc.Why = fmt.Sprintf("the fewest that fit: %s of %s GiB; %d would need %s", total(l, k), budget, k-1, total(l, k-1))
		}
		out = append(out, rc)
		if !autoLean {
			continue
		}
		ew := plan.Choice{Key: "policies.recompute_elementwise", Subject: "model " + name, Value: layerRange(min(l, n), n)}
		switch {
		case !fits:
			ew.Why = "every layer, for the least memory"
		case l == 0:
			ew.Why = "not needed: every layer's activations fit"
		case k > 0:
			ew.Why = fmt.Sprintf("every layer; even so, recomputing none would need %s of %s GiB", total(l, 0), budget)
		default:
			ew.Why = fmt.Sprintf("the fewest that fit: %s of %s GiB; %d would need %s", total(l, 0), budget, l-1, total(l-1, 0))
		}
		out = append(out, ew)
	}
	return out
}

// chooseChunk doubles stage id's chunk from its start while the job fits,
// up to rows (the rows of a micro-batch).
func (s *search) chooseChunk(id string, rows int) (plan.Choice, error) {
	c := plan.Choice{Key: "chunk_tokens", Subject: "stage " + id}
	cur := s.a.chunks[id]
	p, err := s.plan()
	if err != nil {
		return c, err
	}
	var why []string
	for cur < rows {
		next := min(2*cur, rows)
		s.a.chunks[id], s.cur = next, nil
		np, err := s.plan()
		if err != nil {
			return c, err
		}
		if np.DeviceTotal() > s.budget {
			s.a.chunks[id], s.cur = cur, p
			why = append(why, fmt.Sprintf("%d would need %s of %s GiB", next, plan.GiB(np.DeviceTotal()), plan.GiB(s.budget)))
			break
		}
		cur, p = next, np
	}
	c.Value = fmt.Sprintf("%d rows", cur)
	if cur == rows {
		why = append([]string{"a whole micro-batch"}, why...)
	}
	if t := p.DeviceTotal(); t > s.budget {
		why = append(why, fmt.Sprintf("the job does not fit: %s of %s GiB", plan.GiB(t), plan.GiB(s.budget)))
	}
	c.Why = strings.Join(why, "; ")
	return c, nil
}
