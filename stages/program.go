package stages

import (
	"fmt"

	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
)

// PlanContext is what a stage's Plan sees: the job, the stage entry and the
// builder the stage appends its ops and buffers to.
type PlanContext struct {
	Job   *Job
	Stage *spec.Stage
	B     *plan.Builder
	// Sharded maps a model name to the persistent state its apply_fsdp2 stage declared.
	Sharded map[string]*ShardState
	// StepOutputs holds host buffers that carry per-token results between step stages.
	StepOutputs map[string]*plan.Buffer
}

// ShardState is the persistent FSDP2 state of one model on one rank.
type ShardState struct {
	Model  *Model
	Units  []*Unit
	Params *plan.Buffer
	Grads  *plan.Buffer // nil unless trainable
	AdamM  *plan.Buffer
	AdamV  *plan.Buffer
	Fsdp   *ApplyFSDP2
}

// Unit is one FSDP unit of a model on one rank.
type Unit struct {
	model.Unit
	Name string // "embed", "layer<i>", "head"
	// Elems is the element count of the gathered unit: every parameter padded
	// to dp*ceil(rows/dp) rows, so that each rank's dim-0 slice all-gathers
	// in place (FSDP2's padded per-parameter sharding). The head of a tied
	// model includes the embedding.
	Elems      int64
	ShardElems int64 // elements this rank owns (the largest rank's share)
	// Master is the element size of the stored shard: 4 (fp32 master) for a
	// trainable model, the unit's compute dtype size for a frozen one.
	Master int64
}

// unitParams is the number of elements of u's own parameters.
func unitParams(c *model.Config, u model.Unit) int64 { return u.NumParams() }

// shardRows is the number of dim-0 rows the largest rank holds of a dim of n rows.
func shardRows(n int64, dp int) int64 { return (n + int64(dp) - 1) / int64(dp) }

// Units returns the FSDP units of m sharded over dp ranks.
func Units(m *Model, dp int) []*Unit {
	cfg := m.Config
	var out []*Unit
	var embedElems int64
	for _, u := range cfg.Units() {
		nu := &Unit{Unit: u}
		switch u.Kind {
		case model.UnitEmbed:
			nu.Name = "embed"
		case model.UnitHead:
			nu.Name = "head"
		default:
			nu.Name = fmt.Sprintf("layer%d", u.Index)
		}
		for _, p := range u.Params {
			rest := int64(1)
			for _, d := range p.Shape[1:] {
				rest *= d
			}
			nu.ShardElems += shardRows(p.Shape[0], dp) * rest
			nu.Elems += int64(dp) * shardRows(p.Shape[0], dp) * rest
		}
		if u.Kind == model.UnitEmbed {
			embedElems = nu.Elems
		}
		if u.Kind == model.UnitHead && cfg.TieWordEmbeddings {
			nu.Elems += embedElems // the head computes with the tied embedding
		}
		out = append(out, nu)
	}
	return out
}

// dtypeBytes is the element size of a compute dtype.
func dtypeBytes(dt string) int64 {
	if dt == "fp32" {
		return 4
	}
	return 2
}

// Plan declares the pinned host staging buffer: the largest tensor slice one
// rank reads, in fp32. load_hf allocates no device memory.
func (s *LoadHF) Plan(pc *PlanContext) error {
	m := pc.Job.Models[s.Model]
	dp := pc.Job.Spec.Mesh.DP
	var largest int64
	for _, u := range m.Config.Units() {
		for _, p := range u.Params {
			rest := int64(1)
			for _, d := range p.Shape[1:] {
				rest *= d
			}
			largest = max(largest, shardRows(p.Shape[0], dp)*rest)
		}
	}
	op := pc.B.Op("read shard slices of " + s.Model)
	pc.B.AllocHost(pc.Stage.ID+".staging", plan.Comm, 4*largest, op, op)
	return nil
}

// Plan declares the persistent sharded state of the model: fp32 master
// params, and for a trainable model fp32 grads and AdamW m and v, each on the
// device or in pinned host memory per the offload policies.
func (s *ApplyFSDP2) Plan(pc *PlanContext) error {
	m := pc.Job.Models[s.Model]
	units := Units(m, pc.Job.Spec.Mesh.DP)
	var shard int64
	for _, u := range units {
		shard += u.ShardElems
	}
	var stored int64
	for _, u := range units {
		u.Master = 4
		if !m.Trainable {
			dt, err := pc.Job.Precision(m, u.Unit, pc.Stage)
			if err != nil {
				return err
			}
			u.Master = dtypeBytes(dt)
		}
		stored += u.Master * u.ShardElems
	}
	op := pc.B.Op("shard " + s.Model)
	st := &ShardState{Model: m, Units: units, Fsdp: s}
	st.Params = pc.B.Persistent(s.Model+".params", plan.Params, stored, m.Offload, op)
	if m.Trainable {
		st.Grads = pc.B.Persistent(s.Model+".grads", plan.Grads, 4*shard, m.OffloadOptimizer, op)
		st.AdamM = pc.B.Persistent(s.Model+".adam_m", plan.Optimizer, 4*shard, m.OffloadOptimizer, op)
		st.AdamV = pc.B.Persistent(s.Model+".adam_v", plan.Optimizer, 4*shard, m.OffloadOptimizer, op)
	}
	pc.Sharded[s.Model] = st
	return nil
}

// Plan declares the host buffers of the step's packed micro-batches: token
// ids, positions, targets and masks for this rank's share of the step.
func (s *Pack) Plan(pc *PlanContext) error {
	sp := pc.Job.Spec
	tokens := int64(ceilDiv(sp.Data.GlobalBatchSize, sp.Mesh.DP)) * int64(sp.Data.MaxSeqLen)
	op := pc.B.Op("pack micro-batches")
	// ids, positions, targets, logit positions (int32) and mask (fp32) per token.
	pc.StepOutputs["pack"] = pc.B.Persistent(pc.Stage.ID+".packed", plan.IO, 5*4*tokens, true, op)
	return nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// Plan declares one micro-batch of the chunked forward: gathered units with
// prefetch, the fp32 residual stream, per-layer transients and one logits chunk.
func (s *LogProb) Plan(pc *PlanContext) error {
	sp := pc.Job.Spec
	tokens := int64(ceilDiv(sp.Data.GlobalBatchSize, sp.Mesh.DP)) * int64(sp.Data.MaxSeqLen)
	d, err := newDecoderPlan(pc, s.Model, int64(s.ChunkTokens))
	if err != nil {
		return err
	}
	io := d.inputs(false, s.Entropy)
	d.forward(false)
	last := d.headForward(false, s.Entropy)
	for _, b := range io {
		b.End = last
	}
	n := 1
	if s.Entropy {
		n = 2
	}
	pc.StepOutputs[pc.Stage.ID] = pc.B.Persistent(pc.Stage.ID+".out", plan.IO, int64(n)*4*tokens, true, last)
	return nil
}

// Plan declares nothing: the copy goes shard to shard in place.
func (s *UpdateRef) Plan(pc *PlanContext) error {
	pc.B.Op(fmt.Sprintf("copy %s shards into %s", s.From, s.To))
	return nil
}

// decoderPlan declares the buffers of one micro-batch of a decoder model.
type decoderPlan struct {
	pc     *PlanContext
	b      *plan.Builder
	st     *ShardState
	cfg    *model.Config
	dp     int
	prefix string
	T, C   int64
	// per unit compute dtype bytes and recompute flags
	abytes    []int64
	recompute []bool
	gathered  []*plan.Buffer // forward gathered buffer of each unit, as declared
	// saved holds, per decoder unit, the activations kept from forward to backward.
	saved [][]*plan.Buffer
	resid *plan.Buffer // the current residual-stream buffer
}

func newDecoderPlan(pc *PlanContext, name string, chunk int64) (*decoderPlan, error) {
	st := pc.Sharded[name]
	if st == nil {
		return nil, fmt.Errorf("stage %q: model %q has no sharded state (is its apply_fsdp2 stage earlier in the order?)", pc.Stage.ID, name)
	}
	tokens := int64(pc.Job.Spec.Data.MaxTokensPerGPU)
	for _, ps := range pc.Job.stagesOfKind("pack", nil) {
		tokens = int64(pc.Job.Stages[ps.ID].(*Pack).Tokens(pc.Job.Spec))
	}
	d := &decoderPlan{pc: pc, b: pc.B, st: st, cfg: st.Model.Config, dp: pc.Job.Spec.Mesh.DP,
		prefix: pc.Stage.ID, T: tokens, C: min(chunk, tokens)}
	for _, u := range st.Units {
		dt, err := pc.Job.Precision(st.Model, u.Unit, pc.Stage)
		if err != nil {
			return nil, err
		}
		rc, err := pc.Job.Recompute(st.Model, u.Unit, pc.Stage)
		if err != nil {
			return nil, err
		}
		d.abytes = append(d.abytes, dtypeBytes(dt))
		d.recompute = append(d.recompute, rc)
	}
	d.gathered = make([]*plan.Buffer, len(st.Units))
	d.saved = make([][]*plan.Buffer, len(st.Units))
	return d, nil
}

func (d *decoderPlan) name(parts ...any) string {
	s := d.prefix
	for _, p := range parts {
		s += "." + fmt.Sprint(p)
	}
	return s
}

// inputs declares the micro-batch inputs and per-token outputs on the device.
// Their End is set by the caller once the stage's last op is known.
func (d *decoderPlan) inputs(train, entropy bool) []*plan.Buffer {
	op := d.b.Op("upload micro-batch")
	T := d.T
	bufs := []*plan.Buffer{
		d.b.Alloc(d.name("io.ids"), plan.IO, 4*T, op, op),
		d.b.Alloc(d.name("io.positions"), plan.IO, 4*T, op, op),
		d.b.Alloc(d.name("io.cu_seqlens"), plan.IO, 4*(T+1), op, op),
		d.b.Alloc(d.name("io.targets"), plan.IO, 4*T, op, op),
		d.b.Alloc(d.name("io.logit_pos"), plan.IO, 4*T, op, op),
		d.b.Alloc(d.name("io.logp"), plan.IO, 4*T, op, op),
	}
	if entropy || train {
		bufs = append(bufs, d.b.Alloc(d.name("io.entropy"), plan.IO, 4*T, op, op))
	}
	if train {
		bufs = append(bufs,
			d.b.Alloc(d.name("io.dlogp"), plan.IO, 4*T, op, op),
			d.b.Alloc(d.name("io.dentropy"), plan.IO, 4*T, op, op))
	}
	return bufs
}

// gather declares the op that makes unit i's compute copy: a host->device
// copy of the shard when the model is offloaded, a cast of the shard to the
// compute dtype when a collective must send it, and the all-gather into the
// unit's gathered buffer. The gathered buffer's End is set by the caller.
func (d *decoderPlan) gather(i int, tag string) *plan.Buffer {
	u := d.st.Units[i]
	what := "gather " + u.Name
	if tag != "" {
		what += " for backward"
	}
	op := d.b.Op(what)
	a := d.abytes[i]
	g := d.b.Alloc(d.name(tag+"gathered", u.Name), plan.Gathered, a*u.Elems, op, op)
	if d.st.Model.Offload {
		d.b.Alloc(d.name(tag+"h2d", u.Name), plan.Comm, u.Master*u.ShardElems, op, op)
	}
	if d.dp > 1 && a != u.Master {
		d.b.Alloc(d.name(tag+"send", u.Name), plan.Comm, a*u.ShardElems, op, op)
	}
	return g
}

// forward declares embed and decoder forwards. With train set, each decoder
// unit keeps what its backward needs: only its input when it recomputes,
// every activation otherwise. Unit i+1 is gathered before unit i computes
// (prefetch 1).
func (d *decoderPlan) forward(train bool) {
	prefetch := d.st.Fsdp.Prefetch
	n := len(d.st.Units)
	d.gathered[0] = d.gather(0, "")
	for i := 0; i < n-1; i++ { // the head is handled by headForward
		if prefetch > 0 && i+1 < n {
			d.gathered[i+1] = d.gather(i+1, "")
		}
		u := d.st.Units[i]
		if u.Kind == model.UnitEmbed {
			op := d.b.Op("embed forward")
			d.resid = d.b.Alloc(d.name("resid", u.Name), plan.Activations, 4*d.T*int64(d.cfg.HiddenSize), op, op)
		} else {
			d.layerForward(i, train)
		}
		d.gathered[i].End = d.b.Now()
		if prefetch == 0 && i+1 < n {
			d.gathered[i+1] = d.gather(i+1, "")
		}
	}
}

// layerBuffers are one decoder layer's activations (bytes per buffer).
type actSpec struct {
	name  string
	bytes int64
}

// layerActs lists a decoder layer's activations in the order forward makes
// them: everything backward reads. a is the compute dtype size.
func (d *decoderPlan) layerActs(a int64) []actSpec {
	c := d.cfg
	T, H, I := d.T, int64(c.HiddenSize), int64(c.IntermediateSize)
	qd, kd := int64(c.NumHeads*c.HeadDim), int64(c.NumKVHeads*c.HeadDim)
	acts := []actSpec{
		{"xn", a * T * H}, {"rstd1", 4 * T},
	}
	if c.QKNorm {
		acts = append(acts, actSpec{"q_raw", a * T * qd}, actSpec{"k_raw", a * T * kd},
			actSpec{"rstd_q", 4 * T * int64(c.NumHeads)}, actSpec{"rstd_k", 4 * T * int64(c.NumKVHeads)})
	}
	acts = append(acts,
		actSpec{"q", a * T * qd}, actSpec{"k", a * T * kd}, actSpec{"v", a * T * kd},
		actSpec{"attn", a * T * qd}, actSpec{"lse", 4 * T * int64(c.NumHeads)},
		actSpec{"mid", 4 * T * H}, // residual after attention, fp32
		actSpec{"xn2", a * T * H}, actSpec{"rstd2", 4 * T},
		actSpec{"gate", a * T * I}, actSpec{"up", a * T * I}, actSpec{"act", a * T * I},
	)
	return acts
}

// layerForward declares decoder unit i's forward ops. The residual stream is
// fp32 and lives in one buffer per layer boundary when training (the input
// of every layer is saved), or in a single buffer updated in place otherwise.
func (d *decoderPlan) layerForward(i int, train bool) {
	u := d.st.Units[i]
	a := d.abytes[i]
	c := d.cfg
	T, H := d.T, int64(c.HiddenSize)
	ops := []string{"norm1", "qkv", "attention", "o_proj", "norm2", "gate_up", "swiglu", "down"}
	first := d.b.Now() + 1
	idx := map[string]int{}
	for _, o := range ops {
		idx[o] = d.b.Op(fmt.Sprintf("%s %s", u.Name, o))
	}
	last := d.b.Now()
	// Transient lifetimes in forward: from the op that writes to the last op that reads.
	life := map[string][2]string{
		"xn": {"norm1", "qkv"}, "rstd1": {"norm1", "norm1"},
		"q_raw": {"qkv", "qkv"}, "k_raw": {"qkv", "qkv"}, "rstd_q": {"qkv", "qkv"}, "rstd_k": {"qkv", "qkv"},
		"q": {"qkv", "attention"}, "k": {"qkv", "attention"}, "v": {"qkv", "attention"},
		"attn": {"attention", "o_proj"}, "lse": {"attention", "attention"},
		"mid": {"o_proj", "down"}, "xn2": {"norm2", "gate_up"}, "rstd2": {"norm2", "norm2"},
		"gate": {"gate_up", "swiglu"}, "up": {"gate_up", "swiglu"}, "act": {"swiglu", "down"},
	}
	keep := train && !d.recompute[i]
	var saved []*plan.Buffer
	for _, s := range d.layerActs(a) {
		lt := life[s.name]
		if keep {
			saved = append(saved, d.b.Alloc(d.name("saved", u.Name, s.name), plan.Activations, s.bytes, idx[lt[0]], last))
		} else {
			d.b.Alloc(d.name("fwd", u.Name, s.name), plan.Activations, s.bytes, idx[lt[0]], idx[lt[1]])
		}
	}
	// o_proj and down write a [T,H] output in the compute dtype before the fp32 residual add.
	d.b.Alloc(d.name("fwd", u.Name, "o_out"), plan.Activations, a*T*H, idx["o_proj"], idx["o_proj"])
	d.b.Alloc(d.name("fwd", u.Name, "down_out"), plan.Activations, a*T*H, idx["down"], idx["down"])
	if train {
		// The layer's input stays until its backward; the output is a new buffer.
		saved = append(saved, d.resid)
		d.resid = d.b.Alloc(d.name("resid", u.Name), plan.Activations, 4*T*H, idx["down"], idx["down"])
	} else {
		d.resid.End = last
	}
	_ = first
	d.saved[i] = saved
}

// headForward declares the final norm over the rows that predict response
// tokens and the chunked log-prob (and entropy) computation. It returns the
// index of the stage's last forward op.
func (d *decoderPlan) headForward(train, entropy bool) int {
	h := len(d.st.Units) - 1
	if d.gathered[h] == nil {
		d.gathered[h] = d.gather(h, "")
	}
	a := d.abytes[h]
	T, H, V, C := d.T, int64(d.cfg.HiddenSize), int64(d.cfg.VocabSize), d.C
	sel := d.b.Op("head select+norm")
	d.resid.End = sel
	rows := d.b.Alloc(d.name("head", "rows"), plan.Activations, 4*T*H, sel, sel)
	hn := d.b.Alloc(d.name("head", "xn"), plan.Activations, a*T*H, sel, sel)
	rstd := d.b.Alloc(d.name("head", "rstd"), plan.Activations, 4*T, sel, sel)
	ch := d.b.Op("head log-prob chunks")
	hn.End = ch
	d.b.Alloc(d.name("head", "logits"), plan.Logits, 4*C*V, ch, ch)
	if train {
		d.saved[h] = []*plan.Buffer{rows, hn, rstd}
	} else {
		d.gathered[h].End = ch
	}
	return ch
}

// reduce declares the op that moves unit i's unsharded grads into the fp32
// sharded grads: a cast to fp32 and a reduce-scatter when dp > 1, a
// device->host copy when the optimizer state is offloaded.
func (d *decoderPlan) reduce(i int, grad *plan.Buffer) {
	u := d.st.Units[i]
	op := d.b.Op("reduce-scatter grads " + u.Name)
	grad.End = op
	if d.dp > 1 {
		d.b.Alloc(d.name("rs.in", u.Name), plan.Comm, 4*u.Elems, op, op)
		d.b.Alloc(d.name("rs.out", u.Name), plan.Comm, 4*u.ShardElems, op, op)
	} else if d.st.Model.OffloadOptimizer {
		d.b.Alloc(d.name("d2h", u.Name), plan.Comm, 4*u.ShardElems, op, op)
	}
}

// Plan declares one micro-batch of forward (with activation checkpointing per
// the recompute policy), the chunked head forward and backward, the layer
// backwards in reverse with re-gathered units and per-unit grad reduction,
// and the optimizer step.
func (s *Train) Plan(pc *PlanContext) error {
	d, err := newDecoderPlan(pc, s.Model, int64(s.ChunkTokens))
	if err != nil {
		return err
	}
	st := d.st
	if st.Grads == nil {
		return fmt.Errorf("stage %q: model %q is not trainable", pc.Stage.ID, s.Model)
	}
	io := d.inputs(true, true)
	d.forward(true)
	d.headForward(true, true)
	loss := d.b.Op("loss (host)")
	_ = loss
	c := d.cfg
	T, H, V, C := d.T, int64(c.HiddenSize), int64(c.VocabSize), d.C
	n := len(st.Units)
	h := n - 1
	prefetch := st.Fsdp.Prefetch

	// Head backward: recompute each chunk's logits into the workspace, turn
	// them into dlogits in place, accumulate dW and the rows' grad.
	hb := d.b.Op("head backward chunks")
	d.b.Alloc(d.name("bwd", "head", "logits"), plan.Logits, 4*C*V, hb, hb)
	dhn := d.b.Alloc(d.name("bwd", "head", "dxn"), plan.Activations, d.abytes[h]*T*H, hb, hb)
	hgrad := d.b.Alloc(d.name("grad", "head"), plan.Grads, d.abytes[h]*st.Units[h].Elems, hb, hb)
	var next *plan.Buffer // gathered buffer of the unit whose backward comes next
	if prefetch > 0 && h-1 > 0 {
		next = d.gather(h-1, "bwd.")
	}
	hnorm := d.b.Op("head backward norm")
	dhn.End = hnorm
	for _, b := range d.saved[h] {
		b.End = hnorm
	}
	d.gathered[h].End = hnorm
	dres := d.b.Alloc(d.name("bwd", "dresid"), plan.Activations, 4*T*H, hnorm, hnorm)
	d.reduce(h, hgrad)

	for i := h - 1; i >= 1; i-- {
		g := next
		if g == nil {
			g = d.gather(i, "bwd.")
		}
		next = nil
		if prefetch > 0 && i-1 >= 1 {
			next = d.gather(i-1, "bwd.")
		}
		d.layerBackward(i, g, dres)
	}
	// Embedding backward needs no gathered weights: it scatters dresid rows.
	eb := d.b.Op("embed backward")
	dres.End = eb
	egrad := d.b.Alloc(d.name("grad", "embed"), plan.Grads, d.abytes[0]*st.Units[0].Elems, eb, eb)
	for _, b := range d.saved[0] {
		b.End = eb
	}
	d.reduce(0, egrad)
	for _, b := range io {
		b.End = d.b.Now()
	}

	// Optimizer step (once per training step): global grad norm, clip, AdamW
	// over the shards. With the optimizer state offloaded, each unit's grads,
	// m and v (and params, when offloaded) stream through device staging.
	opt := d.b.Op("grad norm + AdamW")
	if st.Model.OffloadOptimizer {
		var largest int64
		for _, u := range st.Units {
			largest = max(largest, u.ShardElems)
		}
		for _, nm := range []string{"grad", "m", "v"} {
			d.b.Alloc(d.name("opt.stage", nm), plan.Comm, 4*largest, opt, opt)
		}
		if st.Model.Offload {
			d.b.Alloc(d.name("opt.stage", "param"), plan.Comm, 4*largest, opt, opt)
		}
	}
	return nil
}

// layerBackward declares decoder unit i's backward: the recomputed forward
// when the unit recomputes, then each op's gradient in reverse.
func (d *decoderPlan) layerBackward(i int, gathered *plan.Buffer, dres *plan.Buffer) {
	u := d.st.Units[i]
	a := d.abytes[i]
	c := d.cfg
	T, H, I := d.T, int64(c.HiddenSize), int64(c.IntermediateSize)
	qd, kd := int64(c.NumHeads*c.HeadDim), int64(c.NumKVHeads*c.HeadDim)
	saved := d.saved[i] // last entry is the layer's input residual
	var rc []*plan.Buffer
	if d.recompute[i] {
		op := d.b.Op(u.Name + " recompute forward")
		for _, s := range d.layerActs(a) {
			rc = append(rc, d.b.Alloc(d.name("rc", u.Name, s.name), plan.Activations, s.bytes, op, op))
		}
	}
	grad := d.b.Alloc(d.name("grad", u.Name), plan.Grads, a*u.Elems, d.b.Now()+1, d.b.Now()+1)
	steps := []struct {
		op   string
		bufs []actSpec
	}{
		{"down backward", []actSpec{{"dy", a * T * H}, {"dact", a * T * I}}},
		{"swiglu backward", []actSpec{{"dgate", a * T * I}, {"dup", a * T * I}}},
		{"gate_up backward", []actSpec{{"dxn2", a * T * H}}},
		{"norm2 backward", nil},
		{"o_proj backward", []actSpec{{"dy_o", a * T * H}, {"dattn", a * T * qd}}},
		{"attention backward", []actSpec{{"dq", a * T * qd}, {"dk", a * T * kd}, {"dv", a * T * kd}}},
		{"qkv backward", []actSpec{{"dxn", a * T * H}}},
		{"norm1 backward", nil},
	}
	// Which op last reads each gradient transient.
	lastUse := map[string]string{
		"dy": "down backward", "dact": "swiglu backward", "dgate": "gate_up backward", "dup": "gate_up backward",
		"dxn2": "norm2 backward", "dy_o": "o_proj backward", "dattn": "attention backward",
		"dq": "qkv backward", "dk": "qkv backward", "dv": "qkv backward", "dxn": "norm1 backward",
	}
	opIdx := map[string]int{}
	var pending []*plan.Buffer
	var pendingNames []string
	for _, s := range steps {
		op := d.b.Op(fmt.Sprintf("%s %s", u.Name, s.op))
		opIdx[s.op] = op
		for _, bs := range s.bufs {
			pending = append(pending, d.b.Alloc(d.name("bwd", u.Name, bs.name), plan.Activations, bs.bytes, op, op))
			pendingNames = append(pendingNames, bs.name)
		}
	}
	for k, b := range pending {
		b.End = opIdx[lastUse[pendingNames[k]]]
	}
	end := d.b.Now()
	for _, b := range append(saved, rc...) {
		b.End = end
	}
	gathered.End = end
	dres.End = end
	grad.End = end
	d.reduce(i, grad)
}
