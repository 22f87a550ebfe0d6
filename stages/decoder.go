package stages

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/stages/rollout"
)

// Op names of a decoder layer, in order. model.Config.LayerForward and
// LayerBackward report each through Batch.Hook, and the arena checks them
// against the plan.
var (
	layerForwardOps  = []string{"norm1", "qkv", "attention", "o_proj", "norm2", "gate_up", "swiglu", "down"}
	layerBackwardOps = []string{"down backward", "swiglu backward", "gate_up backward", "norm2 backward",
		"o_proj backward", "attention backward", "qkv backward", "norm1 backward"}
)

// decoder runs one micro-batch of a decoder model through a stage program.
type decoder struct {
	p      *prog
	st     *ShardState
	cfg    *model.Config
	world  int // the ranks FSDP shards over: dp × cp
	prefix string
	T, N   int // tokens and response tokens of the micro-batch (the budget while planning)
	C      int // log-prob chunk of the current micro-batch
	chunk  int // the stage's chunk_tokens
	samp   model.Sampling
	dts    []gpu.DType
	rc     []bool
	lean   []bool          // per unit: a trained layer that does not recompute keeps no element-wise activations (model.LayerActs.Lean)
	fused  []bool          // per unit: its q, k and v projections run as one product (model.Config.FusedQKV)
	mb     *rollout.Packed // running only
	// cp is mesh.cp; with cp > 1 every micro-batch is split over the
	// rank's cp group (rank cpRank of it), sh is this rank's part of the
	// current one (running only), and attention is ring attention.
	cp, cpRank int
	sh         *rollout.CPShard
	// stored marks, by byte offset, the fp32 grad shards the step's
	// reductions have written so far: the first reduction into a shard
	// stores, later ones (later micro-batches, or a tied weight's other
	// unit) add.
	stored map[int64]bool
	// grads are the update's fp32 sharded grads by unit ordinal, when the
	// model keeps none between updates (update_grads.go); gradsFrom is
	// the op they all live from, or -1. severalMicro says whether a rank
	// may run several micro-batches in an update (Job.severalMicroBatches).
	grads        []*ref
	gradsFrom    int
	severalMicro bool
	// raw are, by unit ordinal, the update's grads of the units whose
	// grads AdamW reads where the backward accumulated them (rawGrads;
	// nil for the others).
	raw []*ref
	// ring and adder add later micro-batches' grads into offloaded grads on
	// the host (see hostAdder); ring is hostAddSlots slots of ringElems.
	ring      *ref
	ringElems int
	adder     *hostAdder
	// acc holds the update's fp32 grad sums on the device under
	// accumulate_grads_on_device (grad_accumulation.go); accOn is set in
	// an update of several micro-batches, which sums into it, accLast in
	// its last one, whose reductions copy the sums to host memory, and
	// accStored marks, by device offset, the shards of acc written so far.
	acc       *ref
	accOn     bool
	accLast   bool
	accStored map[int64]bool

	// pend is the grad reduction still running on the side stream
	// (apply_fsdp2 overlap_reduce); nil when none.
	pend *pendingReduce
	// devNorms has the device sum the squares of staged grads bound for
	// an offloaded optimizer (deviceNorms; nil when none), valid only for
	// an update of one micro-batch on the rank (onlyMicro, running).
	devNorms  *deviceNorms
	onlyMicro bool
	// tied is the head's staging of its grads for the host while the
	// embedding's reduction has yet to add to its tied slot, tiedSlot;
	// rowsN the number of io.rows (tied_rows.go).
	tied     *ref
	tiedSlot int
	rowsN    int
	rowsHost gpu.Tensor // io.rows' values in host memory (running)
	// early is the update's host AdamW started before its backward
	// (host_update_early.go); nil when none.
	early *earlyUpdate

	// kept is, under gather_once, every unit's compute copy for the
	// stage's micro-batches (an update's, in train), and keptFilled is set
	// once the first of them has gathered them (gather_once.go); nil when
	// the units are gathered for each use.
	kept       []*ref
	keptFilled bool

	gathered  []*ref
	bwdAhead  map[int]*ref           // decoder units gathered for the backward ahead of their turn, by unit
	bwdIssued int                    // the lowest unit gathered for the backward so far
	ready     map[*ref]pendingGather // gathered buffers still being filled on the side stream
	deferred  []deferredGather       // late gathers whose side-stream work is not issued yet (running; see lateGathers)
	staging   map[*ref][]*ref        // per gathered buffer, the staging buffers its gather reads on the side stream
	saved     [][]*ref               // per unit: buffers kept from forward to backward (planning lifetimes)
	acts      []*model.LayerActs     // per decoder unit: the activations forward wrote (kept ones are reused by backward)
	layerIn   []*ref                 // per decoder unit: its fp32 input
	resid     *ref
	head      struct{ rows, xn, rstd *ref }
	io        struct{ ids, pos, cu, targets, logitPos, logp, entropy, dlogp, dentropy, rows *ref }
}

// newDecoder prepares the decoder of st's model for micro-batches of at
// most tokens tokens (the batch's budget), with log-prob chunks of chunk
// rows.
func newDecoder(p *prog, st *ShardState, tokens, chunk int, entropyTempered bool) *decoder {
	m := p.job.Spec.Mesh
	d := &decoder{p: p, st: st, cfg: st.Model.Config, world: st.World, cp: m.CPSize(), prefix: p.stage.ID,
		T: tokens, N: tokens, C: min(chunk, tokens), chunk: chunk,
		samp: model.Sampling{Temperature: float32(p.job.Spec.Data.Temperature), EntropyTempered: entropyTempered}}
	for _, u := range st.Units {
		dt, err := p.job.Precision(st.Model, u.Unit, p.stage)
		p.fail(err)
		rc, err := p.job.Recompute(st.Model, u.Unit, p.stage)
		p.fail(err)
		lean, err := p.job.lean(st.Model, u.Unit, p.stage)
		p.fail(err)
		d.dts = append(d.dts, dtypeOf(dt))
		d.rc = append(d.rc, rc)
		d.lean = append(d.lean, lean && !rc)
		d.fused = append(d.fused, u.Kind == model.UnitDecoder && d.cfg.FusedQKV(u.Slots))
	}
	if p.running() {
		d.cpRank = p.r.cpRank(m)
	}
	n := len(st.Units)
	d.gathered = make([]*ref, n)
	d.ready = map[*ref]pendingGather{}
	d.staging = map[*ref][]*ref{}
	d.saved = make([][]*ref, n)
	d.acts = make([]*model.LayerActs, n)
	d.layerIn = make([]*ref, n)
	d.grads = make([]*ref, n)
	d.raw = make([]*ref, n)
	d.gradsFrom = -1
	return d
}

// microBatches returns the micro-batches to run: this rank's of the batch,
// or while planning one placeholder (nil) sized to the budget.
func (d *decoder) microBatches(b *Batch) []*rollout.Packed {
	if !d.p.running() {
		return []*rollout.Packed{nil}
	}
	return b.Micro
}

// beginUpdate starts the micro-batches of one optimizer update: the first
// reduction into each grad shard stores it.
func (d *decoder) beginUpdate() { d.stored = map[int64]bool{} }

// setBatch selects micro-batch mb (running; nil while planning) and sizes
// the buffers to it.
func (d *decoder) setBatch(mb *rollout.Packed) {
	if !d.p.running() {
		return
	}
	d.mb = mb
	d.T, d.N = d.mb.NumTokens(), len(d.mb.Targets)
	if d.cp > 1 {
		sh, err := mb.CPShard(d.cpRank, d.cp)
		if err != nil {
			d.p.fail(err)
			return
		}
		d.sh = sh
		d.T, d.N = len(sh.Tokens), len(sh.Response)
	}
	d.C = max(1, min(d.chunk, d.N))
}

func (d *decoder) name(parts ...any) string {
	s := d.prefix
	for _, x := range parts {
		s += "." + fmt.Sprint(x)
	}
	return s
}

func (d *decoder) b() gpu.Backend { return d.p.r.B }

// inputs declares and uploads the micro-batch inputs and per-token outputs.
// The caller extends them to the stage's last op.
func (d *decoder) inputs(train, entropy bool) []*ref {
	p := d.p
	p.op("upload micro-batch")
	T, N := d.T, d.N
	io := &d.io
	io.ids = p.buf(d.name("io.ids"), plan.IO, gpu.I32, T)
	io.pos = p.buf(d.name("io.positions"), plan.IO, gpu.I32, T)
	io.cu = p.buf(d.name("io.cu_seqlens"), plan.IO, gpu.I32, cuLen(d))
	io.targets = p.buf(d.name("io.targets"), plan.IO, gpu.I32, N)
	io.logitPos = p.buf(d.name("io.logit_pos"), plan.IO, gpu.I32, N)
	io.logp = p.buf(d.name("io.logp"), plan.IO, gpu.F32, N)
	all := []*ref{io.ids, io.pos, io.cu, io.targets, io.logitPos, io.logp}
	io.entropy, io.dlogp, io.dentropy = nil, nil, nil
	if entropy || train {
		io.entropy = p.buf(d.name("io.entropy"), plan.IO, gpu.F32, N)
		all = append(all, io.entropy)
	}
	if train {
		io.dlogp = p.buf(d.name("io.dlogp"), plan.IO, gpu.F32, N)
		io.dentropy = p.buf(d.name("io.dentropy"), plan.IO, gpu.F32, N)
		all = append(all, io.dlogp, io.dentropy)
	}
	io.rows, d.rowsN = nil, 0
	p.do(func() error {
		if d.cp > 1 {
			return d.uploadShard()
		}
		b, mb := d.b(), d.mb
		for _, up := range []struct {
			t   gpu.Tensor
			src []int32
		}{{io.ids.t, mb.Tokens}, {io.pos.t, mb.Positions}, {io.cu.t, mb.CuSeqlens}, {io.targets.t, mb.Targets}, {io.logitPos.t, mb.LogitPos}} {
			if err := b.UploadI32(up.t, up.src); err != nil {
				return err
			}
		}
		return nil
	})
	if train {
		if r := d.planTiedRows(); r != nil {
			all = append(all, r)
		}
	}
	return all
}

// cuLen is the length of cu_seqlens: T+1 while planning (up to T sequences).
func cuLen(d *decoder) int {
	if d.mb != nil {
		return len(d.mb.CuSeqlens) // a cp shard has as many sequences
	}
	return d.T + 1
}

// batch describes the micro-batch to the layers; sc is the ring
// attention's scratch when cp > 1.
func (d *decoder) batch(hook func(string) error, sc *model.RingScratch) model.Batch {
	b := model.Batch{Positions: d.io.pos.t, CuSeqlens: d.io.cu.t, T: d.T, Hook: hook}
	if d.cp > 1 {
		b.Attend, b.AttendBackward = d.ringAttention(sc)
	}
	return b
}

// gather declares the op that makes unit i's compute copy: for each slot, a
// host->device copy of the shard slice when the model is offloaded, a cast
// to the compute dtype when a collective sends it, and the all-gather into
// the unit's gathered buffer. For a unit read in place (inPlace) only the
// fused projection's span is copied, into a buffer of that span, and a
// unit without one gets an empty ref and no op. The caller extends the
// gathered buffer. With late set, the work is issued on the side stream
// only when the next decoder layer's forward enters its MLP product (see
// lateGathers), or when the buffer is awaited, if that comes first.
func (d *decoder) gather(i int, tag string, late bool) *ref {
	p, u, dt := d.p, d.st.Units[i], d.dts[i]
	what := "gather " + u.Name
	if tag != "" {
		what += " for backward"
	}
	lo, hi := d.gatherSpan(i)
	if lo == hi {
		return &ref{} // read in place, with no fused projection: no op
	}
	p.op(what)
	var g *ref
	if d.kept != nil {
		g = d.kept[i] // declared before the stage's micro-batches
	} else {
		g = p.buf(d.name(tag+"gathered", u.Name), plan.Gathered, dt, int(hi-lo))
	}
	var h2d, send *ref
	var h2dOff []int64
	if d.st.Model.Offload {
		// A slot crosses PCIe into the staging buffer, except one read
		// from the host's bf16 copy on one rank, which goes straight into
		// the gathered buffer.
		var n int64
		for _, s := range u.Slots {
			h2dOff = append(h2dOff, n)
			if !d.fromBF16(u, s, dt) || d.world > 1 {
				n += int64(d.gatherSrc(u, s, dt).Size()) * s.ShardElems()
			}
		}
		if n > 0 {
			h2d = p.buf(d.name(tag+"h2d", u.Name), plan.Comm, gpu.BF16, int(n/2))
		}
	}
	needCast := false
	for _, s := range u.Slots {
		needCast = needCast || d.gatherSrc(u, s, dt) != dt
	}
	if d.world > 1 && needCast {
		send = p.buf(d.name(tag+"send", u.Name), plan.Comm, dt, int(u.SliceElems))
	}
	// The side stream reads the staging buffers until the gather completes,
	// which may be as late as the unit's first use: they live as long as
	// the gathered buffer (see untilGathered).
	for _, r := range []*ref{h2d, send} {
		if r != nil {
			d.staging[g] = append(d.staging[g], r)
		}
	}
	issue := d.gatherIssue(u, what, g, lo, hi, h2d, send, h2dOff)
	p.do(func() error {
		if d.kept != nil && d.keptFilled {
			return nil // gathered in the update's first micro-batch
		}
		if late && d.p.r.Side != nil {
			d.deferred = append(d.deferred, deferredGather{g, issue})
			return nil
		}
		return issue()
	})
	return g
}

// gatherSpan is the span [lo, hi) of unit i's gathered layout its gather
// copies: all of it, or for a unit read in place (inPlace) only the fused
// projection's span, which may be empty.
func (d *decoder) gatherSpan(i int) (lo, hi int64) {
	if d.inPlace(i) {
		return model.FusedSpan(d.st.Units[i].Slots)
	}
	return 0, d.st.Units[i].Elems
}

// fromBF16 reports whether a gather of unit u in dtype dt reads slot s
// from its owner's bf16 copy in host memory (ShardState.HostBF16) rather
// than from the owner's master shard.
func (d *decoder) fromBF16(u *Unit, s model.Slot, dt gpu.DType) bool {
	return dt == gpu.BF16 && d.st.HostBF16 != nil && d.st.owner(u, s).BF16Off >= 0
}

// gatherSrc is the dtype a gather of unit u in dtype dt reads slot s in.
func (d *decoder) gatherSrc(u *Unit, s model.Slot, dt gpu.DType) gpu.DType {
	if d.fromBF16(u, s, dt) {
		return gpu.BF16
	}
	return d.st.owner(u, s).Master
}

// lateGatherOp is the decoder layer's sub-op whose start issues the late
// gathers (see lateGathers): the MLP's products, bound by the tensor
// cores, leave the memory to the copies.
const lateGatherOp = "gate_up"

// lateGathersOff issues every gather when its op runs
// (RLPIPE_LATE_GATHERS=0), as before late gathers: for comparisons.
var lateGathersOff = os.Getenv("RLPIPE_LATE_GATHERS") == "0"

// lateGathers reports whether the forward's gather of unit i waits for the
// MLP product of the decoder layer before it. On one rank whose model
// stays on the device a gather is a device-to-device copy, which, issued
// when the layer before starts (as the prefetch declares it), ran beside
// that layer's norm and q/k/v product and took their memory bandwidth: at
// Qwen2.5-3B on an H100 the ref stage's norm1 and qkv took 18.1 ms a step
// beside the copies against 14.5 ms with them started at gate_up
// (docs/performance.md). Collectives and host copies keep their early
// start: an all-gather needs SMs, which the MLP's persistent kernel holds,
// and a host copy needs the time.
func (d *decoder) lateGathers(i int) bool {
	return !lateGathersOff && d.world == 1 && !d.st.Model.Offload && i >= 2 && d.st.Units[i-1].Kind == model.UnitDecoder
}

// inPlaceOff copies every gathered unit (RLPIPE_GATHER_IN_PLACE=0), as
// before units were used in place: for comparisons.
var inPlaceOff = os.Getenv("RLPIPE_GATHER_IN_PLACE") == "0"

// inPlace reports whether unit i is used in place: on one rank whose model
// stays on the device, a unit whose every slot is stored, in its owner's
// shard, in the unit's compute dtype (a frozen model's, or any in fp32)
// is its own gathered copy, and the forward and backward read the shard.
// Only the span the fused q/k/v projection reads as one matrix and one
// vector (model.FusedSpan) is copied, because the shard keeps the
// parameters' own order, which checkpoints store, and interleaves each
// bias with its weight: at Qwen2.5-3B, 10.5 of a layer's 154 MB. The copies
// had taken memory bandwidth and power from the ref stage's products
// (docs/performance.md).
func (d *decoder) inPlace(i int) bool {
	if inPlaceOff || d.world != 1 || d.st.Model.Offload {
		return false
	}
	u := d.st.Units[i]
	for _, s := range u.Slots {
		if d.st.owner(u, s).Master != d.dts[i] {
			return false
		}
	}
	return true
}

// source returns the SlotSource of unit i's weights, gathered into g (see
// gather): g's slots, or for a unit used in place its shard's, except the
// fused projection's span, which g holds.
func (d *decoder) source(i int, g *ref) model.SlotSource {
	if !d.inPlace(i) {
		return model.Gathered(g.t)
	}
	u := d.st.Units[i]
	lo, hi := model.FusedSpan(u.Slots)
	return func(s model.Slot) (gpu.Tensor, error) {
		if s.Offset >= lo && s.Offset < hi {
			s.Offset -= lo
			return model.SlotView(s, g.t)
		}
		sh, err := d.st.paramShard(u, s)
		if err != nil {
			return gpu.Tensor{}, err
		}
		s.Offset = 0
		return model.SlotView(s, sh)
	}
}

// deferredGather is a late gather's side-stream work not yet issued.
type deferredGather struct {
	g     *ref
	issue func() error
}

// flushGathers issues the late gathers' side-stream work, in order, up to
// that of g (all of them when g is nil); none when g is not among them.
func (d *decoder) flushGathers(g *ref) error {
	if g != nil && !slices.ContainsFunc(d.deferred, func(q deferredGather) bool { return q.g == g }) {
		return nil
	}
	for len(d.deferred) > 0 {
		q := d.deferred[0]
		d.deferred = d.deferred[1:]
		if err := q.issue(); err != nil {
			return err
		}
		if q.g == g {
			break
		}
	}
	return nil
}

// gatherIssue returns the side-stream work of gather (see there): the
// slots in span [lo, hi) of the gathered layout into g, which starts at lo.
func (d *decoder) gatherIssue(u *Unit, what string, g *ref, lo, hi int64, h2d, send *ref, h2dOff []int64) func() error {
	return func() error {
		if gatherIssued != nil {
			gatherIssued(d.prefix, u)
		}
		b, comm := d.b(), d.p.r.Comm
		side := d.p.r.Side
		if side != nil {
			// The gathered buffer may reuse the memory of a unit the
			// compute stream has not finished with: start after everything
			// issued so far on it.
			if err := waitCompute(b, side); err != nil {
				return err
			}
			b, comm = b.On(side), comm.On(side)
			if err := d.p.r.timelineMark(side, markSideStart, what); err != nil {
				return err
			}
		}
		var dsts, srcs []gpu.Tensor // the slots' all-gathers, issued together
		for k, s := range u.Slots {
			if s.Offset < lo || s.Offset >= hi {
				continue
			}
			if err := d.st.settleUnit(d.st.owner(u, s)); err != nil {
				return err
			}
			var src gpu.Tensor
			var err error
			bf16 := d.fromBF16(u, s, g.t.DType)
			if bf16 {
				src, err = d.st.hostBF16(u, s)
			} else {
				src, err = d.st.paramShard(u, s)
			}
			if err != nil {
				return err
			}
			if h2d != nil && !(bf16 && d.world == 1) {
				stg, err := section(h2d.t, h2dOff[k], src.DType, s.ShardElems())
				if err != nil {
					return err
				}
				if err := b.Copy(stg, src); err != nil {
					return err
				}
				src = stg
			}
			dst, err := g.t.Flat(int(s.Offset-lo), int(s.Offset-lo+s.PaddedElems()))
			if err != nil {
				return err
			}
			if d.world == 1 {
				if err := b.Copy(dst, src); err != nil {
					return err
				}
				continue
			}
			if send != nil {
				sv, err := u.sliceOf(send.t, k)
				if err != nil {
					return err
				}
				if err := b.Copy(sv, src); err != nil {
					return err
				}
				src = sv
			}
			dsts, srcs = append(dsts, dst), append(srcs, src)
		}
		if d.world > 1 {
			if err := allGatherSlots(d.p.ctx, comm, u, dsts, srcs); err != nil {
				return err
			}
		}
		if side != nil {
			if err := d.p.r.timelineMark(side, markSideEnd, what); err != nil {
				return err
			}
			ev, err := side.Record()
			if err != nil {
				return err
			}
			d.ready[g] = pendingGather{ev: ev, what: what}
		}
		return nil
	}
}

// groupGatherer is a communicator that all-gathers several tensors as
// one operation (libnccl's: one NCCL group).
type groupGatherer interface {
	AllGatherGroup(ctx context.Context, dst, src []gpu.Tensor) error
}

// allGatherSlots all-gathers unit u's slots, src[k] into dst[k]: as one
// group where comm offers it, else slot by slot.
func allGatherSlots(ctx context.Context, comm nccl.Comm, u *Unit, dst, src []gpu.Tensor) error {
	if g, ok := comm.(groupGatherer); ok {
		if err := g.AllGatherGroup(ctx, dst, src); err != nil {
			return fmt.Errorf("all-gather %s: %w", u.Name, err)
		}
		return nil
	}
	for k := range src {
		if err := comm.AllGather(ctx, dst[k], src[k]); err != nil {
			return fmt.Errorf("all-gather %s: %w", u.Slots[k].Name, err)
		}
	}
	return nil
}

// groupReducer is a communicator that reduce-scatters several tensors as
// one operation (libnccl's: one NCCL group).
type groupReducer interface {
	ReduceScatterGroup(ctx context.Context, dst, src []gpu.Tensor, op nccl.Op) error
}

// reduceScatterSlots averages unit u's slot grads over the ranks, src[k]
// into this rank's slice dst[k]: as one group where comm offers it, else
// slot by slot.
func reduceScatterSlots(ctx context.Context, comm nccl.Comm, u *Unit, dst, src []gpu.Tensor) error {
	if g, ok := comm.(groupReducer); ok {
		if err := g.ReduceScatterGroup(ctx, dst, src, nccl.Avg); err != nil {
			return fmt.Errorf("reduce-scatter %s: %w", u.Name, err)
		}
		return nil
	}
	for k := range src {
		if err := comm.ReduceScatter(ctx, dst[k], src[k], nccl.Avg); err != nil {
			return fmt.Errorf("reduce-scatter %s: %w", u.Slots[k].Name, err)
		}
	}
	return nil
}

// untilGathered extends gathered buffer g, and the staging buffers its
// gather reads, to op i. A kept unit's (gather_once) first use awaits its
// gather, so its staging buffers end there while the unit lives on: later
// uses do not extend them.
func (d *decoder) untilGathered(i int, g *ref) {
	until(i, g)
	until(i, d.staging[g]...)
	if d.kept != nil {
		delete(d.staging, g)
	}
}

// await makes the compute stream wait until gathered buffer g is filled.
func (d *decoder) await(g *ref) error {
	if err := d.flushGathers(g); err != nil {
		return err
	}
	pg, ok := d.ready[g]
	if !ok {
		return nil
	}
	delete(d.ready, g)
	defer pg.ev.Close()
	return d.waitSide(pg.ev, pg.what)
}

// pendingGather is a gather running on the side stream: the event
// recorded after it and its op's name.
type pendingGather struct {
	ev   gpu.Event
	what string
}

// waitSide makes the compute stream wait for ev, an event of the side
// stream after what (a gather's or reduction's op), marking the wait on
// the step's timeline as the stage's wait for what.
func (d *decoder) waitSide(ev gpu.Event, what string) error {
	r := d.p.r
	name := d.prefix + ": " + what
	if err := r.timelineMark(nil, markWait, name); err != nil {
		return err
	}
	if err := d.b().DefaultStream().Wait(ev); err != nil {
		return err
	}
	return r.timelineMark(nil, markWaited, name)
}

// forward runs the embedding and the decoder layers. With train set, every
// decoder layer keeps its fp32 input until its backward, and, when it does
// not recompute, all its activations. Units i+1 … i+prefetch are gathered
// before unit i computes; with prefetch 0, unit i+1 after it.
func (d *decoder) forward(train bool) {
	prefetch := d.st.Fsdp.Prefetch
	n := len(d.st.Units)
	issued := 0 // units gathered so far
	gatherTo := func(k int) {
		for ; issued <= min(k, n-1); issued++ {
			d.gathered[issued] = d.gather(issued, "", d.lateGathers(issued))
		}
	}
	gatherTo(0)
	for i := 0; i < n-1; i++ {
		gatherTo(i + prefetch)
		if d.st.Units[i].Kind == model.UnitEmbed {
			d.embedForward()
		} else {
			d.layerForward(i, train)
		}
		d.untilGathered(d.p.now(), d.gathered[i])
		gatherTo(i + 1)
	}
}

func (d *decoder) embedForward() {
	p := d.p
	p.op("embed forward")
	d.resid = p.buf(d.name("resid", "embed"), plan.Activations, gpu.F32, d.T, d.cfg.HiddenSize)
	p.do(func() error {
		if err := d.await(d.gathered[0]); err != nil {
			return err
		}
		w, err := d.source(0, d.gathered[0])(d.st.Units[0].Slots[0])
		if err != nil {
			return err
		}
		return d.b().Embedding(d.resid.t, w, d.io.ids.t)
	})
}

// actSpec is one activation buffer of a decoder layer and the forward ops
// that write and last read it.
type actSpec struct {
	name        string
	dt          gpu.DType
	shape       []int
	first, last string
	field       func(a *model.LayerActs) *gpu.Tensor
	forwardOnly bool // scratch the backward does not read
}

// layerActs lists a decoder layer's activations for T tokens in compute
// dtype dt. A lean layer's element-wise ones (xn, xn2, act) are forward
// scratch: its backward recomputes them.
//
// A transient forward (no backward follows; model.LayerActs.Transient) has
// no act of its own: act is gate's buffer (layerForward sets it), which lives
// until down. The backend either writes act there in the gate/up op, from
// xn2 (a fused product and SwiGLU, which leaves gate unwritten), or runs
// the products and SwiGLU in place over gate. Either way act's bytes are
// apart from xn2's, and the layer's peak is xn2, gate and up at gate_up,
// below the gate, up and act of the swiglu op otherwise.
//
// Any other forward has act from the gate/up op: a backend with the fused
// product that keeps gate and up (model.LayerActs.Transient's) writes act
// there too, while it reads xn2, which a lean or recomputed layer frees at
// that op.
func (d *decoder) layerActs(dt gpu.DType, lean, fused, transient bool) []actSpec {
	c := d.cfg
	gateLast := "swiglu"
	if transient {
		gateLast = "down"
	}
	T, H, I := d.T, c.HiddenSize, c.IntermediateSize
	qd, kd := c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim
	f := func(g func(a *model.LayerActs) *gpu.Tensor) func(a *model.LayerActs) *gpu.Tensor { return g }
	acts := []actSpec{
		{"xn", dt, []int{T, H}, "norm1", "qkv", f(func(a *model.LayerActs) *gpu.Tensor { return &a.Xn }), lean},
		{"rstd1", gpu.F32, []int{T}, "norm1", "norm1", f(func(a *model.LayerActs) *gpu.Tensor { return &a.Rstd1 }), false},
	}
	if c.QKNorm {
		acts = append(acts,
			actSpec{"q_raw", dt, []int{T, qd}, "qkv", "qkv", f(func(a *model.LayerActs) *gpu.Tensor { return &a.QRaw }), false},
			actSpec{"k_raw", dt, []int{T, kd}, "qkv", "qkv", f(func(a *model.LayerActs) *gpu.Tensor { return &a.KRaw }), false},
			actSpec{"rstd_q", gpu.F32, []int{T * c.NumHeads}, "qkv", "qkv", f(func(a *model.LayerActs) *gpu.Tensor { return &a.RstdQ }), false},
			actSpec{"rstd_k", gpu.F32, []int{T * c.NumKVHeads}, "qkv", "qkv", f(func(a *model.LayerActs) *gpu.Tensor { return &a.RstdK }), false})
	}
	if fused {
		acts = append(acts, actSpec{"qkv", dt, []int{T, qd + 2*kd}, "qkv", "qkv", f(func(a *model.LayerActs) *gpu.Tensor { return &a.QKV }), true})
	}
	acts = append(acts,
		actSpec{"q", dt, []int{T, qd}, "qkv", "attention", f(func(a *model.LayerActs) *gpu.Tensor { return &a.Q }), false},
		actSpec{"k", dt, []int{T, kd}, "qkv", "attention", f(func(a *model.LayerActs) *gpu.Tensor { return &a.K }), false},
		actSpec{"v", dt, []int{T, kd}, "qkv", "attention", f(func(a *model.LayerActs) *gpu.Tensor { return &a.V }), false},
		actSpec{"attn", dt, []int{T, qd}, "attention", "o_proj", f(func(a *model.LayerActs) *gpu.Tensor { return &a.Attn }), false},
		actSpec{"lse", gpu.F32, []int{c.NumHeads, T}, "attention", "attention", f(func(a *model.LayerActs) *gpu.Tensor { return &a.LSE }), false},
		actSpec{"o_out", dt, []int{T, H}, "o_proj", "norm2", f(func(a *model.LayerActs) *gpu.Tensor { return &a.OOut }), true},
		actSpec{"mid", gpu.F32, []int{T, H}, "norm2", "down", f(func(a *model.LayerActs) *gpu.Tensor { return &a.Mid }), false},
		actSpec{"xn2", dt, []int{T, H}, "norm2", "gate_up", f(func(a *model.LayerActs) *gpu.Tensor { return &a.Xn2 }), lean},
		actSpec{"rstd2", gpu.F32, []int{T}, "norm2", "norm2", f(func(a *model.LayerActs) *gpu.Tensor { return &a.Rstd2 }), false},
		actSpec{"gate", dt, []int{T, I}, "gate_up", gateLast, f(func(a *model.LayerActs) *gpu.Tensor { return &a.Gate }), false},
		actSpec{"up", dt, []int{T, I}, "gate_up", "swiglu", f(func(a *model.LayerActs) *gpu.Tensor { return &a.Up }), false},
	)
	if !transient {
		acts = append(acts, actSpec{"act", dt, []int{T, I}, "gate_up", "down", f(func(a *model.LayerActs) *gpu.Tensor { return &a.Act }), lean})
	}
	acts = append(acts, actSpec{"down_out", dt, []int{T, H}, "down", "down", f(func(a *model.LayerActs) *gpu.Tensor { return &a.DownOut }), true})
	return acts
}

// hook returns the Batch hook that enters unit u's sub-ops on the arena.
func (d *decoder) hook(u *Unit) func(string) error {
	return func(op string) error {
		d.p.op(u.Name + " " + op)
		if op == lateGatherOp && d.p.running() {
			if err := d.flushGathers(nil); err != nil {
				return err
			}
		}
		return d.p.err
	}
}

// layerForward declares (and runs) decoder unit i's forward ops. The fp32
// residual stream is updated in place outside training; in training the
// layer's input stays and its output is a new buffer.
func (d *decoder) layerForward(i int, train bool) {
	p, u, dt := d.p, d.st.Units[i], d.dts[i]
	keep := train && !d.rc[i]
	lean := keep && d.lean[i]
	acts := d.layerActs(dt, lean, d.fused[i], !train)
	var out *ref
	la := &model.LayerActs{Lean: lean, Transient: !train}
	if !p.running() {
		idx := map[string]int{}
		for _, o := range layerForwardOps {
			idx[o] = p.op(u.Name + " " + o)
		}
		last := p.now()
		var saved []*ref
		for _, a := range acts {
			kind := "fwd"
			if keep && !a.forwardOnly {
				kind = "saved"
			}
			end := idx[a.last]
			if kind == "saved" {
				end = last
			}
			pb := p.b.Alloc(d.name(kind, u.Name, a.name), plan.Activations, int64(a.dt.Size())*numel(a.shape), idx[a.first], end)
			if kind == "saved" {
				saved = append(saved, &ref{pb: pb})
			}
		}
		d.ringBufs(u, dt, "fwd", false, idx["attention"])
		if train {
			d.layerIn[i] = d.resid
			out = &ref{pb: p.b.Alloc(d.name("resid", u.Name), plan.Activations, int64(4*d.T*d.cfg.HiddenSize), idx["down"], idx["down"])}
		} else {
			until(last, d.resid)
		}
		d.saved[i] = saved
		if train {
			d.resid = out
		}
		return
	}
	for _, a := range acts {
		kind := "fwd"
		if keep && !a.forwardOnly {
			kind = "saved"
		}
		*a.field(la) = p.buf(d.name(kind, u.Name, a.name), plan.Activations, a.dt, a.shape...).t
	}
	if !train {
		la.Act = la.Gate // see layerActs
	}
	sc := d.ringBufs(u, dt, "fwd", false, -1)
	out = d.resid
	if train {
		d.layerIn[i] = d.resid
		out = p.buf(d.name("resid", u.Name), plan.Activations, gpu.F32, d.T, d.cfg.HiddenSize)
	}
	if keep {
		d.acts[i] = la
	}
	p.do(func() error {
		if err := d.await(d.gathered[i]); err != nil {
			return err
		}
		w, err := d.cfg.LayerWeightsOf(u.Unit, u.Slots, d.source(i, d.gathered[i]))
		if err != nil {
			return err
		}
		return d.cfg.LayerForward(d.b(), w, la, d.resid.t, out.t, d.batch(d.hook(u), sc))
	})
	d.resid = out
}

// headRows starts a head: it gathers the head unit, selects the rows at
// the micro-batch's logit positions into d.head and normalises them (op
// "head select+norm"), then opens the chunk op chunkOp with its buffer of
// one chunk of logits. It returns the head unit's index, the chunk op and
// the logits buffer.
func (d *decoder) headRows(chunkOp string) (h, ch int, logits *ref) {
	p := d.p
	h = len(d.st.Units) - 1
	if d.gathered[h] == nil {
		d.gathered[h] = d.gather(h, "", false)
	}
	dt, H, V := d.dts[h], d.cfg.HiddenSize, d.cfg.VocabSize
	sel := p.op("head select+norm")
	until(sel, d.resid)
	d.head.rows = p.buf(d.name("head", "rows"), plan.Activations, gpu.F32, d.N, H)
	d.head.xn = p.buf(d.name("head", "xn"), plan.Activations, dt, d.N, H)
	d.head.rstd = p.buf(d.name("head", "rstd"), plan.Activations, gpu.F32, d.N)
	p.do(func() error { return model.SelectRows(d.b(), d.head.rows.t, d.resid.t, d.io.logitPos.t) })
	ch = p.op(chunkOp)
	until(ch, d.head.rows, d.head.xn, d.head.rstd)
	logits = p.buf(d.name("head", "logits"), plan.Logits, gpu.F32, d.C, V)
	return h, ch, logits
}

// headWeights waits for the gathered head unit h and returns its weights
// (running only).
func (d *decoder) headWeights(h int) (model.HeadWeights, error) {
	if err := d.await(d.gathered[h]); err != nil {
		return model.HeadWeights{}, err
	}
	u := d.st.Units[h]
	return d.cfg.HeadWeightsOf(u.Unit, u.Slots, d.source(h, d.gathered[h]))
}

// headForward computes the log-probs (and entropy) of the response tokens
// chunk by chunk. It returns the index of its last op.
func (d *decoder) headForward(train bool) int {
	h, ch, logits := d.headRows("head log-prob chunks")
	d.p.do(func() error {
		w, err := d.headWeights(h)
		if err != nil {
			return err
		}
		var ent gpu.Tensor
		if d.io.entropy != nil {
			ent = d.io.entropy.t
		}
		return d.cfg.HeadForward(d.b(), w, d.head.rows.t, d.head.xn.t, d.head.rstd.t, d.io.targets.t, d.io.logp.t, ent, logits.t, d.C, d.samp)
	})
	if train {
		d.saved[h] = []*ref{d.head.rows, d.head.xn, d.head.rstd}
	} else {
		d.untilGathered(ch, d.gathered[h])
	}
	return ch
}

// reduce moves unit i's unsharded grads into the fp32 sharded grads of the
// units that own them: with dp > 1 a cast to fp32 and an averaging
// reduce-scatter; with the optimizer state offloaded, through a device
// staging buffer into host memory. The step's first reduction into a shard
// stores its grads, later ones add theirs.
//
// With overlap_reduce (and dp × cp > 1) the reduction runs on the rank's
// side stream, after the compute stream's work so far and, in issue order,
// with the gathers (one NCCL communicator serves that stream: its
// collectives never run concurrently with each other). The compute stream
// goes on with the next unit's backward and waits for the reduction only
// at the next reduction (settleReduce), which its buffers and grad live
// until.
//
// With the optimizer state offloaded, the copies into host memory run on
// the rank's Down stream instead, so that they cross PCIe while the compute
// stream goes on with the next unit's backward and the side stream brings
// the next units' params the other way. The Down stream waits for the
// stream that staged the grads: the compute stream (dp × cp = 1), or the
// side stream that reduce-scattered them. The compute stream waits for the
// copies at the next reduction, which the staged grads (and what the side
// stream read) live until.
func (d *decoder) reduce(i int, grad *ref) {
	p, u := d.p, d.st.Units[i]
	if d.rawGrads(u) {
		// AdamW reads them there; they live to the optimizer op.
		d.raw[u.ord] = grad
		return
	}
	op := p.op("reduce-scatter grads " + u.Name)
	d.settleReduce(op)
	until(op, grad)
	d.declareGrads(u)
	toHost := d.st.Model.OffloadOptimizer
	overlap := d.st.OverlapReduce && d.world > 1 && !toHost
	var rsIn, rsOut, d2h *ref
	if d.world > 1 {
		rsIn = p.buf(d.name("rs.in", u.Name), plan.Comm, gpu.F32, int(u.Elems))
		rsOut = p.buf(d.name("rs.out", u.Name), plan.Comm, gpu.F32, int(u.SliceElems))
	} else if toHost {
		d2h = p.buf(d.name("d2h", u.Name), plan.Comm, gpu.F32, int(u.SliceElems))
	}
	held := d.holdTied(op, u, d2h)
	var pr *pendingReduce
	switch {
	case overlap:
		pr = &pendingReduce{bufs: []*ref{grad, rsIn, rsOut}, what: "reduce-scatter grads " + u.Name}
		d.pend = pr
	case toHost:
		// The side stream reads grad and rs.in when it reduce-scatters.
		pr = &pendingReduce{what: "grads to host " + u.Name}
		if rsIn != nil {
			pr.bufs = append(pr.bufs, grad, rsIn)
		}
		for _, r := range []*ref{rsOut, d2h, held} {
			if r != nil {
				pr.bufs = append(pr.bufs, r)
			}
		}
		d.pend = pr
	}
	p.do(func() error {
		b, comm := d.b(), d.p.r.Comm
		var rs gpu.Stream
		// Grads bound for the host over the Down stream are staged on the
		// compute stream (a device copy, not worth queueing behind the side
		// stream's gathers), unless they are reduce-scattered first.
		down := toHost && d.p.r.Down != nil
		if pr != nil && d.p.r.Side != nil && (!down || rsIn != nil) {
			rs = d.p.r.Side
			if err := waitCompute(b, rs); err != nil {
				return err
			}
			b, comm = b.On(rs), comm.On(rs)
			if err := d.p.r.timelineMark(rs, markSideStart, "reduce-scatter grads "+u.Name); err != nil {
				return err
			}
		}
		// Three passes: each slot's grads cast into the reduction's input
		// (or staged for the host); the slots' reduce-scatters, issued
		// together; each shard stored or added to.
		if stagingHook != nil {
			if err := stagingHook(b, grad.t); err != nil {
				return err
			}
		}
		dsts, srcs := make([]gpu.Tensor, len(u.Slots)), make([]gpu.Tensor, len(u.Slots))
		var rsDst, rsSrc []gpu.Tensor
		for k, s := range u.Slots {
			full, err := grad.t.Flat(int(s.Offset), int(s.Offset+s.PaddedElems()))
			if err != nil {
				return err
			}
			if err := d.st.settleUnit(d.st.owner(u, s)); err != nil {
				return err
			}
			if dsts[k], err = d.gradShard(u, s); err != nil {
				return err
			}
			srcs[k] = full
			switch {
			case rsIn != nil:
				in, err := rsIn.t.Flat(int(s.Offset), int(s.Offset+s.PaddedElems()))
				if err != nil {
					return err
				}
				if err := b.Copy(in, full); err != nil {
					return err
				}
				out, err := u.sliceOf(rsOut.t, k)
				if err != nil {
					return err
				}
				rsDst, rsSrc = append(rsDst, out), append(rsSrc, in)
				srcs[k] = out
			case d2h != nil && d.accOn:
				// Summed on the device from the grads themselves.
			case d2h != nil:
				stg, err := u.sliceOf(d2h.t, k)
				if err != nil {
					return err
				}
				if err := b.Copy(stg, full); err != nil {
					return err
				}
				if held != nil && d.onlyMicro {
					if err := d.addHeld(b, stg, held); err != nil {
						return err
					}
				}
				srcs[k] = stg
			}
		}
		if rsIn != nil {
			if err := reduceScatterSlots(d.p.ctx, comm, u, rsDst, rsSrc); err != nil {
				return err
			}
		}
		var send []bool // with accOn: the slots whose sums cross now
		if d.accOn {
			var err error
			if send, err = d.accumulate(b, u, srcs); err != nil {
				return err
			}
			if err := d.accSums(b, u); err != nil {
				return err
			}
		} else if d.devNorms != nil {
			sv, stores := d2h, true
			if rsOut != nil {
				sv = rsOut
			}
			for k := range u.Slots {
				if dsts[k].Numel() > 0 && d.stored[dsts[k].Off] {
					stores = false
				}
			}
			if held != nil && d.onlyMicro {
				stores = true // the staged grads are the shard's total
			}
			if err := d.devNorms.sumStaged(b, u, sv.t, d.onlyMicro, stores); err != nil {
				return err
			}
		}
		// Grads summed on the device cross only in the last micro-batch.
		onDown := down && (!d.accOn || d.accLast)
		if onDown {
			// The Down stream waits for the stream that staged the grads.
			staged := b.DefaultStream()
			if rs != nil {
				staged = rs
				if err := d.p.r.timelineMark(rs, markSideEnd, ""); err != nil {
					return err
				}
			}
			rs = d.p.r.Down
			if err := waitStream(staged, rs); err != nil {
				return err
			}
			b = b.On(rs)
			if err := d.p.r.timelineMark(rs, markDownStart, pr.what); err != nil {
				return err
			}
		}
		added := false // host adds queued (addOnHost)
		for k, s := range u.Slots {
			dst, src := dsts[k], srcs[k]
			// The step's first reduction into the shard writes it, the
			// others add to it. Into host memory the write is a DMA copy,
			// where an add would read and write across PCIe. An empty
			// shard (a rank with no rows of the slot) may share its offset
			// with the next slot's: it must not mark it. Grads summed on
			// the device cross only when accumulate says.
			if dst.Numel() == 0 || (d.accOn && !send[k]) {
				continue
			}
			if o := d.st.owner(u, s); d.devNorms != nil && o != u {
				d.devNorms.wrote(o.ord)
			}
			if !d.stored[dst.Off] {
				if err := b.Copy(dst, src); err != nil {
					return fmt.Errorf("storing %s: %w", s.Name, err)
				}
				d.stored[dst.Off] = true
				continue
			}
			if held != nil && d.onlyMicro {
				if err := d.sendRows(b, dst, src, s); err != nil {
					return fmt.Errorf("storing %s's rows: %w", s.Name, err)
				}
				continue
			}
			if held != nil && d.ring != nil {
				if err := d.addRowsOnHost(b, rs, dst, src, s, held); err != nil {
					return fmt.Errorf("accumulating %s's rows: %w", s.Name, err)
				}
				added = true
				continue
			}
			if d.ring != nil {
				if err := d.addOnHost(b, rs, dst, src); err != nil {
					return fmt.Errorf("accumulating %s: %w", s.Name, err)
				}
				added = true
				continue
			}
			if err := b.AddScaled(dst, src, 1); err != nil {
				return fmt.Errorf("accumulating %s: %w", s.Name, err)
			}
		}
		if d.early != nil {
			// The shards this reduction wrote last are final once the
			// stream that stored them gets here.
			s := rs
			if s == nil {
				s = b.DefaultStream()
			}
			if err := d.arrive(s, u, added); err != nil {
				return err
			}
		}
		if rs != nil {
			end := markSideEnd
			if onDown {
				end = markDownEnd
			}
			if err := d.p.r.timelineMark(rs, end, ""); err != nil {
				return err
			}
			ev, err := rs.Record()
			if err != nil {
				return err
			}
			pr.done = ev
		}
		return nil
	})
}

// stagingHook, set only by tests, runs on the backend that is about to
// stage or reduce a unit's grads (grad, unsharded), before it does: a test
// delays that stream with it to show that the Down and compute streams
// wait for the staged grads.
var stagingHook func(b gpu.Backend, grad gpu.Tensor) error

// waitCompute makes work issued on s from now on wait for the work issued
// so far on b's default (compute) stream.
func waitCompute(b gpu.Backend, s gpu.Stream) error {
	return waitStream(b.DefaultStream(), s)
}

// waitStream makes work issued on s from now on wait for the work issued
// so far on from.
func waitStream(from, s gpu.Stream) error {
	ev, err := from.Record()
	if err != nil {
		return err
	}
	defer ev.Close()
	return s.Wait(ev)
}

// pendingReduce is a grad reduction running on the side stream, or grads
// crossing to the host on the Down stream: the buffers it reads (planning)
// and the event recorded after it (running).
type pendingReduce struct {
	bufs []*ref
	done gpu.Event
	what string // the reduction's op
}

// settleReduce makes the compute stream wait, at op i, for the reduction
// still running on the side stream, whose buffers live until op i.
func (d *decoder) settleReduce(i int) {
	pr := d.pend
	if pr == nil {
		return
	}
	d.pend = nil
	until(i, pr.bufs...)
	d.p.do(func() error {
		if pr.done == nil {
			return nil
		}
		defer pr.done.Close()
		return d.waitSide(pr.done, pr.what)
	})
}

// zeroed declares a gradient buffer and zeroes it when running.
func (d *decoder) zeroed(name string, kind plan.Kind, dt gpu.DType, shape ...int) *ref {
	r := d.p.buf(name, kind, dt, shape...)
	d.p.do(func() error { return d.b().Zero(r.t) })
	return r
}

// headBackward recomputes each chunk's logits, turns them into dlogits and
// accumulates the head's grads and the rows' grads, then scatters the rows'
// grads into the residual gradient.
func (d *decoder) headBackward() (dres *ref) {
	p := d.p
	h := len(d.st.Units) - 1
	u := d.st.Units[h]
	dt, H, V := d.dts[h], d.cfg.HiddenSize, d.cfg.VocabSize
	hb := p.op("head backward")
	grad := d.zeroed(d.name("grad", "head"), plan.Grads, dt, int(u.Elems))
	logits := p.buf(d.name("bwd", "head", "logits"), plan.Logits, gpu.F32, d.C, V)
	dxn := p.buf(d.name("bwd", "head", "dxn"), plan.Activations, dt, d.N, H)
	drows := p.buf(d.name("bwd", "head", "drows"), plan.Activations, gpu.F32, d.N, H)
	_ = hb
	p.do(func() error {
		w, err := d.cfg.HeadWeightsOf(u.Unit, u.Slots, d.source(h, d.gathered[h]))
		if err != nil {
			return err
		}
		dw, err := d.cfg.HeadWeightsFrom(u.Unit, u.Slots, grad.t)
		if err != nil {
			return err
		}
		return d.cfg.HeadBackward(d.b(), w, dw, d.head.rows.t, d.head.xn.t, d.head.rstd.t, d.io.targets.t,
			d.io.dlogp.t, d.io.dentropy.t, dxn.t, drows.t, logits.t, d.C, d.samp)
	})
	d.untilGathered(p.now(), d.gathered[h])
	until(p.now(), d.saved[h]...)
	return d.headScatter(grad, drows)
}

// headStep runs the head's forward and backward in one pass over the
// chunks (model.Config.HeadStep): after each chunk's log-probs, grad(lo,
// hi) writes the loss gradient of rows [lo,hi) into d.io.dlogp and
// d.io.dentropy, and the chunk's logits become its gradients without being
// computed again. It returns the residual gradient, as headBackward does.
func (d *decoder) headStep(grad func(lo, hi int) error) *ref {
	p := d.p
	h, _, logits := d.headRows("head forward-backward")
	u := d.st.Units[h]
	dt, H := d.dts[h], d.cfg.HiddenSize
	dw := d.zeroed(d.name("grad", "head"), plan.Grads, dt, int(u.Elems))
	dxn := p.buf(d.name("bwd", "head", "dxn"), plan.Activations, dt, d.N, H)
	drows := p.buf(d.name("bwd", "head", "drows"), plan.Activations, gpu.F32, d.N, H)
	// Each chunk's row statistics, from its LogProbs to its LogitsBackward.
	stats := p.buf(d.name("head", "lpstats"), plan.Logits, gpu.F32, d.C, gpu.LogProbsStatsCols)
	p.do(func() error {
		w, err := d.headWeights(h)
		if err != nil {
			return err
		}
		dhw, err := d.cfg.HeadWeightsFrom(u.Unit, u.Slots, dw.t)
		if err != nil {
			return err
		}
		return d.cfg.HeadStep(d.b(), w, dhw, d.head.rows.t, d.head.xn.t, d.head.rstd.t, d.io.targets.t, d.io.logp.t,
			d.io.entropy.t, d.io.dlogp.t, d.io.dentropy.t, dxn.t, drows.t, logits.t, stats.t, d.C, d.samp, grad)
	})
	d.untilGathered(p.now(), d.gathered[h])
	until(p.now(), d.head.rows, d.head.xn, d.head.rstd)
	return d.headScatter(dw, drows)
}

func (d *decoder) headScatter(grad, drows *ref) *ref {
	p := d.p
	h := len(d.st.Units) - 1
	d.bwdAhead, d.bwdIssued = map[int]*ref{}, h
	if d.regather() {
		d.gatherBackTo(h - d.st.Fsdp.Prefetch)
	}
	sc := p.op("head backward scatter")
	until(sc, drows)
	dres := p.buf(d.name("bwd", "dresid"), plan.Activations, gpu.F32, d.T, d.cfg.HiddenSize)
	p.do(func() error {
		if err := d.b().Zero(dres.t); err != nil {
			return err
		}
		return model.ScatterAddRows(d.b(), dres.t, drows.t, d.io.logitPos.t)
	})
	d.reduce(h, grad)
	return dres
}

// layerBackward runs decoder unit i's backward: the recomputed forward when
// the unit recomputes, then each op's gradient in reverse, then the grad
// reduction. g is the unit's re-gathered params.
func (d *decoder) layerBackward(i int, g, dres *ref) {
	p, u, dt := d.p, d.st.Units[i], d.dts[i]
	c := d.cfg
	T, H, I := d.T, c.HiddenSize, c.IntermediateSize
	qd, kd := c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim
	la := d.acts[i]
	var rc []*ref
	if d.rc[i] {
		p.op(u.Name + " recompute forward")
		la = &model.LayerActs{}
		for _, a := range d.layerActs(dt, false, d.fused[i], false) {
			if a.name == "down_out" {
				continue // the recomputed forward stops before down_proj
			}
			r := p.buf(d.name("rc", u.Name, a.name), plan.Activations, a.dt, a.shape...)
			*a.field(la) = r.t
			if !a.forwardOnly {
				rc = append(rc, r) // the backward reads it; forward scratch ends with the recompute
			}
		}
		sc := d.ringBufs(u, dt, "rc", false, -1)
		p.do(func() error {
			if err := d.await(g); err != nil {
				return err
			}
			w, err := c.LayerWeightsOf(u.Unit, u.Slots, d.source(i, g))
			if err != nil {
				return err
			}
			return c.LayerForward(d.b(), w, la, d.layerIn[i].t, gpu.Tensor{}, d.batch(nil, sc))
		})
	}
	type gradSpec struct {
		name  string
		shape []int
		first string // the backward op that writes it
		last  string // the backward op that last reads it
		field func(*model.LayerGradBufs) *gpu.Tensor
	}
	grads := []gradSpec{
		{"dy", []int{T, H}, "down backward", "down backward", func(x *model.LayerGradBufs) *gpu.Tensor { return &x.Dy }},
		// dgate takes dy·W_down (SwiGLU's backward then runs in place), or
		// a backend writes dgate and dup from dy in one op: both from the
		// down backward.
		{"dgate", []int{T, I}, "down backward", "gate_up backward", func(x *model.LayerGradBufs) *gpu.Tensor { return &x.Dgate }},
		{"dup", []int{T, I}, "down backward", "gate_up backward", func(x *model.LayerGradBufs) *gpu.Tensor { return &x.Dup }},
		{"dxn2", []int{T, H}, "gate_up backward", "norm2 backward", func(x *model.LayerGradBufs) *gpu.Tensor { return &x.Dxn2 }},
		{"dy_o", []int{T, H}, "norm2 backward", "o_proj backward", func(x *model.LayerGradBufs) *gpu.Tensor { return &x.DyO }},
		{"dattn", []int{T, qd}, "o_proj backward", "attention backward", func(x *model.LayerGradBufs) *gpu.Tensor { return &x.Dattn }},
		{"dq", []int{T, qd}, "attention backward", "qkv backward", func(x *model.LayerGradBufs) *gpu.Tensor { return &x.Dq }},
		{"dk", []int{T, kd}, "attention backward", "qkv backward", func(x *model.LayerGradBufs) *gpu.Tensor { return &x.Dk }},
		{"dv", []int{T, kd}, "attention backward", "qkv backward", func(x *model.LayerGradBufs) *gpu.Tensor { return &x.Dv }},
		{"dxn", []int{T, H}, "qkv backward", "norm1 backward", func(x *model.LayerGradBufs) *gpu.Tensor { return &x.Dxn }},
	}
	if d.fused[i] {
		grads = append(grads, gradSpec{"dqkv", []int{T, qd + 2*kd}, "qkv backward", "qkv backward", func(x *model.LayerGradBufs) *gpu.Tensor { return &x.Dqkv }})
	}
	// A lean layer's recomputed act lives in dgate until dW_down.
	var grad *ref
	gb := &model.LayerGradBufs{}
	if !p.running() {
		idx := map[string]int{}
		for _, o := range layerBackwardOps {
			idx[o] = p.op(u.Name + " " + o)
		}
		first := idx[layerBackwardOps[0]]
		grad = &ref{pb: p.b.Alloc(d.name("grad", u.Name), plan.Grads, int64(dt.Size())*u.Elems, first, first)}
		for _, x := range grads {
			p.b.Alloc(d.name("bwd", u.Name, x.name), plan.Activations, int64(dt.Size())*numel(x.shape), idx[x.first], idx[x.last])
		}
		d.ringBufs(u, dt, "bwd", true, idx["attention backward"])
	} else {
		grad = d.zeroed(d.name("grad", u.Name), plan.Grads, dt, int(u.Elems))
		for _, x := range grads {
			*x.field(gb) = p.buf(d.name("bwd", u.Name, x.name), plan.Activations, dt, x.shape...).t
		}
		sc := d.ringBufs(u, dt, "bwd", true, -1)
		p.do(func() error {
			if err := d.await(g); err != nil {
				return err
			}
			w, err := c.LayerWeightsOf(u.Unit, u.Slots, d.source(i, g))
			if err != nil {
				return err
			}
			dw, err := c.LayerWeightsFrom(u.Unit, u.Slots, grad.t)
			if err != nil {
				return err
			}
			return c.LayerBackward(d.b(), w, dw, la, gb, d.layerIn[i].t, dres.t, d.batch(d.hook(u), sc))
		})
	}
	end := p.now()
	until(end, append(append(d.saved[i], rc...), d.layerIn[i], dres, grad)...)
	d.untilGathered(end, g)
	d.reduce(i, grad)
}

// gatherBackTo gathers, for the backward, the decoder units from the
// lowest not yet gathered down to unit k (not below unit 1: the
// embedding's backward needs no weights), in the order the backward uses
// them.
func (d *decoder) gatherBackTo(k int) {
	for ; d.bwdIssued > max(k, 1); d.bwdIssued-- {
		d.bwdAhead[d.bwdIssued-1] = d.gather(d.bwdIssued-1, "bwd.", false)
	}
}

// backward runs the head backward, the decoder layers in reverse, and the
// embedding backward. With reshard_after_forward (the default) each unit is
// gathered again for its backward, prefetching the next; without it the
// units gathered in the forward stay until their backward.
func (d *decoder) backward() { d.backwardFrom(d.headBackward()) }

// backwardFrom runs the decoder layers' and the embedding's backward from
// the residual gradient dres the head wrote.
func (d *decoder) backwardFrom(dres *ref) {
	p := d.p
	h := len(d.st.Units) - 1
	for i := h - 1; i >= 1; i-- {
		if !d.regather() {
			d.layerBackward(i, d.gathered[i], dres)
			continue
		}
		d.gatherBackTo(i - d.st.Fsdp.Prefetch)
		g := d.bwdAhead[i]
		delete(d.bwdAhead, i)
		d.layerBackward(i, g, dres)
	}
	// The embedding backward needs no gathered weights: it scatters dresid rows.
	eb := p.op("embed backward")
	until(eb, dres, d.resid)
	u := d.st.Units[0]
	grad := d.zeroed(d.name("grad", "embed"), plan.Grads, d.dts[0], int(u.Elems))
	p.do(func() error {
		dw, err := model.SlotView(u.Slots[0], grad.t)
		if err != nil {
			return err
		}
		return d.b().EmbeddingBackward(dw, dres.t, d.io.ids.t)
	})
	d.reduce(0, grad)
	// Nothing is left to overlap the last reduction with: the grads are
	// complete on the compute stream from here on.
	d.settleReduce(p.now())
}

// planHostAdds declares the pinned ring through which later micro-batches'
// grads reach offloaded grads (see hostAdder), live from now to the op the
// caller extends it to.
func (d *decoder) planHostAdds() *ref {
	var largest int64
	for _, u := range d.st.Units {
		for _, s := range u.Slots {
			largest = max(largest, s.ShardElems())
		}
	}
	d.ringElems = int(max(min(largest, hostAddChunk), 1))
	d.ring = d.p.hostBuf(d.p.stage.ID+".grad_ring", plan.Comm, gpu.F32, hostAddSlots*d.ringElems)
	if d.p.running() {
		d.adder = newHostAdder(d.p.r.Host)
	}
	return d.ring
}

// addOnHost queues dst += src, chunk by chunk: each chunk is copied from
// the device into a ring slot on s, the stream b issues on (nil: the
// default stream), and added on the host once the copy is done.
func (d *decoder) addOnHost(b gpu.Backend, s gpu.Stream, dst, src gpu.Tensor) error {
	if s == nil {
		s = b.DefaultStream()
	}
	n := dst.Numel()
	for off := 0; off < n; off += d.ringElems {
		m := min(d.ringElems, n-off)
		k := d.adder.acquire()
		slot, err := d.ring.t.Flat(k*d.ringElems, k*d.ringElems+m)
		if err != nil {
			return err
		}
		sv, err := src.Flat(off, off+m)
		if err != nil {
			return err
		}
		dv, err := dst.Flat(off, off+m)
		if err != nil {
			return err
		}
		if err := b.Copy(slot, sv); err != nil {
			return err
		}
		ev, err := s.Record()
		if err != nil {
			return err
		}
		d.adder.add(k, ev, dv, slot)
	}
	return nil
}
