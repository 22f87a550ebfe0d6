package stages

import (
	"context"
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
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
	state *planState
}

// RunContext is what a stage's Run sees on one rank.
type RunContext struct {
	Job   *Job
	Stage *spec.Stage
	Rank  *Rank
}

func (pc *PlanContext) prog() *prog {
	return &prog{job: pc.Job, stage: pc.Stage, b: pc.B, ps: pc.state, ctx: context.Background()}
}

func (rc *RunContext) prog(ctx context.Context) *prog {
	return &prog{job: rc.Job, stage: rc.Stage, r: rc.Rank, ctx: ctx}
}

// run plans a stage program.
func (pc *PlanContext) run(program func(*prog)) error {
	p := pc.prog()
	program(p)
	return p.done()
}

// run executes a stage program on the context's rank.
func (rc *RunContext) run(ctx context.Context, program func(*prog)) error {
	p := rc.prog(ctx)
	program(p)
	p.fail(rc.Rank.profileOp(""))
	return p.done()
}

// shards returns the sharded state map of the mode.
func (p *prog) shards() map[string]*ShardState {
	if p.running() {
		return p.r.Shards
	}
	return p.ps.sharded
}

// ShardState is the persistent FSDP2 state of one model on one rank.
type ShardState struct {
	Model  *Model
	Fsdp   *ApplyFSDP2
	Units  []*Unit
	Params *ref // one section per unit, in the unit's master dtype
	Grads  *ref // fp32, one section per unit; nil unless trainable
	AdamM  *ref
	AdamV  *ref
}

// Unit is one FSDP unit of a model on one rank.
type Unit struct {
	model.Unit
	Name  string
	Slots []model.Slot // the gathered layout (model.Config.Layout)
	// Elems is the element count of the gathered unit: every parameter
	// padded to dp*ceil(rows/dp) rows so each rank's dim-0 slice
	// all-gathers in place (FSDP2's padded per-parameter sharding). The
	// head of a tied model includes the embedding.
	Elems int64
	// ShardElems is the element count of this rank's shard of the unit's
	// own parameters.
	ShardElems int64
	// SliceElems is Elems/dp: this rank's slice of the gathered unit,
	// including a tied embedding that another unit owns.
	SliceElems int64
	// SliceOff is, per slot, its element offset in the rank's slice.
	SliceOff []int64
	// Master is the dtype of the stored shard: F32 (the fp32 master) for
	// a trainable model, the unit's compute dtype for a frozen one.
	Master gpu.DType
	// Off and GradOff are the byte offsets of the unit's section in the
	// params and in the fp32 grads / AdamW buffers.
	Off, GradOff int64
}

// sliceOf returns slot k's part of t, a buffer laid out as the rank's slice
// of u (SliceOff).
func (u *Unit) sliceOf(t gpu.Tensor, k int) (gpu.Tensor, error) {
	off := int(u.SliceOff[k])
	return t.Flat(off, off+int(u.Slots[k].ShardElems()))
}

// Units returns the FSDP units of m sharded over dp ranks.
func Units(m *Model, dp int) []*Unit {
	cfg := m.Config
	var out []*Unit
	for _, u := range cfg.Units() {
		nu := &Unit{Unit: u, Slots: cfg.Layout(u, dp)}
		switch u.Kind {
		case model.UnitEmbed:
			nu.Name = "embed"
		case model.UnitHead:
			nu.Name = "head"
		default:
			nu.Name = fmt.Sprintf("layer%d", u.Index)
		}
		nu.Elems = model.LayoutElems(nu.Slots)
		nu.ShardElems = model.LayoutShardElems(nu.Slots)
		for _, s := range nu.Slots {
			nu.SliceOff = append(nu.SliceOff, nu.SliceElems)
			nu.SliceElems += s.ShardElems()
		}
		out = append(out, nu)
	}
	return out
}

// owner returns the unit whose shard holds slot s of unit u.
func (st *ShardState) owner(u *Unit, s model.Slot) *Unit {
	if s.Tied {
		return st.Units[0]
	}
	return u
}

// paramShard is the view of slot s's rows in its owner's params shard.
func (st *ShardState) paramShard(u *Unit, s model.Slot) (gpu.Tensor, error) {
	o := st.owner(u, s)
	return section(st.Params.t, o.Off+s.ShardOffset*int64(o.Master.Size()), o.Master, s.ShardElems())
}

// fp32Shard is the view of slot s's rows in an fp32 per-unit buffer (grads, m, v).
func (st *ShardState) fp32Shard(buf *ref, u *Unit, s model.Slot) (gpu.Tensor, error) {
	o := st.owner(u, s)
	return section(buf.t, o.GradOff+s.ShardOffset*4, gpu.F32, s.ShardElems())
}

// section views elems elements of dt at byte offset off of t's memory.
func section(t gpu.Tensor, off int64, dt gpu.DType, elems int64) (gpu.Tensor, error) {
	return gpu.NewTensor(t.Mem, t.Off+off, dt, int(elems))
}

// dtypeOf maps a precision policy value to a dtype.
func dtypeOf(dt string) gpu.DType {
	if dt == "fp32" {
		return gpu.F32
	}
	return gpu.BF16
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// stepTokens bounds the tokens of one rank's share of a step.
func stepTokens(sp *spec.Spec) int {
	return ceilDiv(sp.Data.GlobalBatchSize, sp.Mesh.DP) * sp.Data.MaxSeqLen
}

// Plan declares the op of opening the checkpoint.
func (s *LoadHF) Plan(pc *PlanContext) error { return pc.run(s.program) }

// Run checks that the model's weights are present.
func (s *LoadHF) Run(ctx context.Context, rc *RunContext) error { return rc.run(ctx, s.program) }

// program opens the checkpoint. load_hf allocates nothing: apply_fsdp2
// streams each rank's slices of it into the shards.
func (s *LoadHF) program(p *prog) {
	p.op("open checkpoint of " + s.Model)
	p.do(func() error {
		if m := p.job.Models[s.Model]; m.Checkpoint == nil {
			return fmt.Errorf("model %q: %s has config.json but no model.safetensors: rlpipe run needs the weights", s.Model, m.Dir)
		}
		return nil
	})
}

// Plan declares the persistent sharded state.
func (s *ApplyFSDP2) Plan(pc *PlanContext) error { return pc.run(s.program) }

// Run allocates the shards and streams the checkpoint into them.
func (s *ApplyFSDP2) Run(ctx context.Context, rc *RunContext) error { return rc.run(ctx, s.program) }

// program declares the persistent sharded state of the model: the params
// (fp32 master for a trainable model, the compute dtype for a frozen one),
// and for a trainable model fp32 grads and AdamW m and v, each on the
// device or in pinned host memory per the offload policies. Running, it
// streams each rank's dim-0 slice of every tensor from the checkpoint
// through one pinned staging buffer into the shard.
func (s *ApplyFSDP2) program(p *prog) {
	m := p.job.Models[s.Model]
	dp := p.job.Spec.Mesh.DP
	units := Units(m, dp)
	var paramBytes, gradBytes, largest int64
	for _, u := range units {
		u.Master = gpu.F32
		if !m.Trainable {
			dt, err := p.job.Precision(m, u.Unit, p.stage)
			if err != nil {
				p.fail(err)
				return
			}
			u.Master = dtypeOf(dt)
		}
		u.Off, u.GradOff = paramBytes, gradBytes
		paramBytes += plan.AlignUp(int64(u.Master.Size()) * u.ShardElems)
		gradBytes += plan.AlignUp(4 * u.ShardElems)
		for _, sl := range u.Slots {
			if !sl.Tied {
				largest = max(largest, sl.ShardElems())
			}
		}
	}
	p.op("shard " + s.Model)
	st := &ShardState{Model: m, Units: units, Fsdp: s}
	staging := p.hostBuf(p.stage.ID+".staging", plan.Comm, gpu.F32, int(largest))
	st.Params = p.persistentBytes(s.Model+".params", plan.Params, m.Offload, paramBytes)
	if m.Trainable {
		st.Grads = p.persistentBytes(s.Model+".grads", plan.Grads, m.OffloadOptimizer, gradBytes)
		st.AdamM = p.persistentBytes(s.Model+".adam_m", plan.Optimizer, m.OffloadOptimizer, gradBytes)
		st.AdamV = p.persistentBytes(s.Model+".adam_v", plan.Optimizer, m.OffloadOptimizer, gradBytes)
	}
	p.shards()[s.Model] = st
	p.do(func() error { return loadShards(p, st, staging.t) })
}

// loadShards zeroes the sharded state and reads this rank's rows of every
// tensor into the params.
func loadShards(p *prog, st *ShardState, staging gpu.Tensor) error {
	b, rank, dp := p.r.B, p.r.ID, p.job.Spec.Mesh.DP
	for _, r := range []*ref{st.Params, st.Grads, st.AdamM, st.AdamV} {
		if r != nil {
			if err := b.Zero(r.t); err != nil {
				return err
			}
		}
	}
	ck := st.Model.Checkpoint
	if ck == nil {
		return fmt.Errorf("model %q has no weights to load", st.Model.Name())
	}
	buf := make([]float32, staging.Numel())
	for _, u := range st.Units {
		for _, s := range u.Slots {
			if s.Tied {
				continue
			}
			r0 := int64(rank) * s.ShardRows
			r1 := min(r0+s.ShardRows, s.Rows())
			if r1 <= r0 {
				continue // this rank holds only padding of s
			}
			n := int((r1 - r0) * s.RowElems())
			if err := ck.ReadRows(s.Name, r0, r1, buf[:n]); err != nil {
				return fmt.Errorf("rank %d of %d: %w", rank, dp, err)
			}
			stg, err := staging.Flat(0, n)
			if err != nil {
				return err
			}
			if err := b.Upload(stg, buf[:n]); err != nil {
				return err
			}
			dst, err := st.paramShard(u, s)
			if err != nil {
				return err
			}
			if dst, err = dst.Flat(0, n); err != nil {
				return err
			}
			if err := b.Copy(dst, stg); err != nil {
				return fmt.Errorf("loading %s: %w", s.Name, err)
			}
		}
	}
	return nil
}

// Plan declares the host buffer of the step's packed micro-batches.
func (s *Pack) Plan(pc *PlanContext) error { return pc.run(s.program) }

// Run packs this rank's share of the step.
func (s *Pack) Run(ctx context.Context, rc *RunContext) error { return rc.run(ctx, s.program) }

func (s *Pack) program(p *prog) {
	p.op("pack micro-batches")
	// ids, positions, targets, logit positions (int32) and mask (fp32) per token.
	p.hostBuf(p.stage.ID+".packed", plan.IO, gpu.I32, 5*stepTokens(p.job.Spec))
	p.do(func() error { return packStep(p, s) })
}

// Plan declares nothing: the copy goes shard to shard in place.
func (s *UpdateRef) Plan(pc *PlanContext) error { return pc.run(s.program) }

// Run copies the shards.
func (s *UpdateRef) Run(ctx context.Context, rc *RunContext) error { return rc.run(ctx, s.program) }

func (s *UpdateRef) program(p *prog) {
	p.op(fmt.Sprintf("copy %s shards into %s", s.From, s.To))
	p.do(func() error {
		from, to := p.r.Shards[s.From], p.r.Shards[s.To]
		for i, u := range from.Units {
			v := to.Units[i]
			src, err := section(from.Params.t, u.Off, u.Master, u.ShardElems)
			if err != nil {
				return err
			}
			dst, err := section(to.Params.t, v.Off, v.Master, v.ShardElems)
			if err != nil {
				return err
			}
			if err := p.r.B.Copy(dst, src); err != nil {
				return fmt.Errorf("unit %s: %w", u.Name, err)
			}
		}
		return nil
	})
}
