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
// default), and the log-prob chunk of each stage whose chunk_tokens is
// auto (the default). Plan makes them and Run reads them: what the plan
// prints is what runs.
type autoChoices struct {
	recompute map[string]int // by model: its decoder layers with index < n recompute
	chunks    map[string]int // by stage id: the chunk's rows
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
		case *RefLogProb:
			c = s.ChunkTokens
		case *ActorLogProb:
			c = s.ChunkTokens
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
// micro-batch) that still fits. Fewer recomputed layers save a forward
// per layer in the backward; larger chunks mean fewer, larger GEMMs and
// passes over the logits. The plan's Auto entries say what was chosen and
// why.
func Plan(j *Job) (*plan.Plan, error) {
	a := &autoChoices{recompute: map[string]int{}, chunks: map[string]int{}}
	j.auto = a
	trained := j.autoModels()
	chunked := j.autoChunkStages()
	if len(trained) == 0 && len(chunked) == 0 {
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

// chooseRecompute sets the fewest recomputed layers with which the job's
// device total stays within budget, by bisection: recomputing one more of
// the first layers frees its saved activations, so the total falls as k
// grows, except perhaps at the last layer, whose activations the backward
// needs at once (recomputing it saves only what the head holds while they
// would be kept). So the bisection runs over 1 to L-1 and L is tried on
// its own. When nothing fits, k is the count with the smallest total.
func (s *search) chooseRecompute(trained map[string]int) ([]plan.Choice, error) {
	most := 0
	for _, n := range trained {
		most = max(most, n)
	}
	set := func(k int) {
		for name, n := range trained {
			s.a.recompute[name] = min(k, n)
		}
	}
	at := map[int]*plan.Plan{} // by layers recomputed, the plans tried
	try := func(k int) (bool, error) {
		set(k)
		s.cur = nil
		p, err := s.plan()
		if err != nil {
			return false, err
		}
		at[k] = p
		return p.DeviceTotal() <= s.budget, nil
	}
	ok, err := try(0)
	if err != nil {
		return nil, err
	}
	if ok || most == 0 {
		return recomputeChoices(s.a, trained, 0, at, s.budget), nil
	}
	k, inner := 0, false
	if most > 1 {
		if inner, err = try(most - 1); err != nil {
			return nil, err
		}
	}
	switch {
	case inner:
		lo, hi := 1, most-1
		for lo < hi {
			mid := (lo + hi) / 2
			fits, err := try(mid)
			if err != nil {
				return nil, err
			}
			if fits {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		k = lo
	default:
		if ok, err = try(most); err != nil {
			return nil, err
		}
		k = most
		if p, tried := at[most-1]; !ok && tried && p.DeviceTotal() < at[most].DeviceTotal() {
			k = most - 1
		}
	}
	if _, tried := at[k-1]; !tried {
		if _, err := try(k - 1); err != nil {
			return nil, err
		}
	}
	set(k)
	s.cur = at[k]
	return recomputeChoices(s.a, trained, k, at, s.budget), nil
}

// recomputeChoices describes the layers each trained model recomputes
// with k chosen, at holding the plans tried by layer count.
func recomputeChoices(a *autoChoices, trained map[string]int, k int, at map[int]*plan.Plan, budget int64) []plan.Choice {
	total := func(k int) string { return plan.GiB(at[k].DeviceTotal()) }
	names := make([]string, 0, len(trained))
	for name := range trained {
		names = append(names, name)
	}
	slices.Sort(names)
	var out []plan.Choice
	for _, name := range names {
		n := a.recompute[name]
		c := plan.Choice{Key: "policies.recompute", Subject: "model " + name, Value: fmt.Sprintf("layers 0-%d of %d", n-1, trained[name])}
		if n == 1 {
			c.Value = fmt.Sprintf("layer 0 of %d", trained[name])
		}
		switch {
		case n == 0:
			c.Value = fmt.Sprintf("none of %d layers", trained[name])
			c.Why = fmt.Sprintf("every layer's activations fit: %s of %s GiB", total(0), plan.GiB(budget))
		case at[k].DeviceTotal() > budget:
			if n == trained[name] {
				c.Value = fmt.Sprintf("all %d layers", n)
			}
			c.Why = fmt.Sprintf("the least memory, and the job still needs %s of %s GiB", total(k), plan.GiB(budget))
		default:
			c.Why = fmt.Sprintf("the fewest that fit: %s of %s GiB; %d would need %s", total(k), plan.GiB(budget), k-1, total(k-1))
		}
		out = append(out, c)
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
