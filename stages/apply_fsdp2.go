package stages

import (
	"context"
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
)

func init() {
	Register(Kind{Name: "apply_fsdp2", Phase: spec.Setup,
		Doc: "shard a model FSDP2-style: fp32 master shards, per-unit gather for compute, grads and AdamW state",
		New: func() Stage {
			return &ApplyFSDP2{ReshardAfterForward: true, Prefetch: 1, OverlapReduce: spec.BoolAuto, AccumulateGradsOnDevice: spec.BoolAuto, GatherOnce: spec.BoolAuto, Replicate: spec.BoolAuto}
		}})
}

var _ Stage = (*ApplyFSDP2)(nil)

// ApplyFSDP2 shards a model over the dp ranks. It reads the checkpoint of
// the model (of its source, for a copy_of model) and writes the model's
// weights: the ShardState every stage that computes with the model reads.
type ApplyFSDP2 struct {
	Model               string `yaml:"model"`
	ReshardAfterForward bool   `yaml:"reshard_after_forward"`
	Prefetch            int    `yaml:"prefetch"` // units gathered ahead of the one computing (0, 1 or 2)
	// OverlapReduce reduce-scatters a unit's grads on the stream the
	// units are gathered on, so that the reduction overlaps the next
	// unit's backward; the unit's unsharded grads and reduction buffers
	// then live one unit longer (the plan counts them). Auto by default:
	// planning chooses (auto_options.go).
	OverlapReduce spec.AutoBool `yaml:"overlap_reduce"`
	// HostBF16Copy keeps a bf16 copy of an offloaded model's fp32 master
	// params in pinned host memory (hostBF16Units), which the gathers of
	// its units computed in bf16 copy to the device instead of the fp32
	// masters.
	HostBF16Copy bool `yaml:"host_bf16_copy"`
	// AccumulateGradsOnDevice keeps the rank's fp32 grad shards of a model
	// whose optimizer state is offloaded on the device as well, through
	// each update of several micro-batches: their grads are summed there,
	// as on a model that is not offloaded, and only the sum crosses to
	// host memory, in the update's last micro-batch (grad_accumulation.go).
	// Auto by default: planning chooses (auto_options.go).
	AccumulateGradsOnDevice spec.AutoBool `yaml:"accumulate_grads_on_device"`
	// GatherOnce has every stage that computes with the model gather each
	// unit once (the train stage once an update), in its first
	// micro-batch's forward, and keep every unit's compute copy on the
	// device until its last micro-batch is done (gather_once.go). Auto by
	// default: planning chooses (auto_options.go).
	GatherOnce spec.AutoBool `yaml:"gather_once"`
	// Replicate keeps the whole of a frozen model on every rank instead of
	// a 1/world shard: the stages computing with it read its units in
	// place and gather nothing. It takes (world−1)/world of the model's
	// bytes more on each rank. Only a model that no stage trains, with its
	// params on the device and mesh.cp 1, that no step stage but
	// update_ref writes (it gathers its sharded source into the replica),
	// can be replicated. Auto by default: planning chooses
	// (auto_options.go).
	Replicate spec.AutoBool `yaml:"replicate"`
}

// Ports declares the checkpoint input and the weights output. A model
// that is a copy (copy_of) reads its source's checkpoint, and also takes
// the source's weights when a setup stage shards the source (optional
// input "source"): it then starts as a copy of those shards, made on the
// device, instead of reading the files again.
func (s *ApplyFSDP2) Ports(sp *spec.Spec) Ports {
	src := s.Model
	for _, m := range sp.Models {
		if m.Name == s.Model && m.CopyOf != "" {
			src = m.CopyOf
		}
	}
	in := []Input{{Port: Port{Name: "checkpoint", Type: TypeCheckpoint(src)}}}
	if src != s.Model {
		in = append(in, Input{Port: Port{Name: "source", Type: TypeWeights(src)}, Optional: true})
	}
	return Ports{In: in, Out: []Port{{Name: "weights", Type: TypeWeights(s.Model)}}}
}

// Validate checks the model, the prefetch depth, that overlap_reduce does
// not meet an offloaded optimizer, that host_bf16_copy and
// accumulate_grads_on_device have the offloaded model they need, that a
// replicated model can be, and that the model is sharded once.
func (s *ApplyFSDP2) Validate(vc *ValidateContext) spec.Errors {
	m, errs := vc.model("model", s.Model)
	if s.Prefetch < 0 || s.Prefetch > 2 {
		errs = append(errs, vc.Errorf("prefetch", "prefetch must be 0, 1 or 2, got %d", s.Prefetch))
	}
	if s.OverlapReduce.IsTrue() && m != nil && m.OffloadOptimizer {
		errs = append(errs, vc.Errorf("overlap_reduce", "overlap_reduce is not supported with offload_optimizer (model %q): its grads reach the host through a ring the reduction feeds in order", s.Model))
	}
	if s.HostBF16Copy && m != nil && !(m.Trainable && m.Offload && m.OffloadOptimizer) {
		errs = append(errs, vc.Errorf("host_bf16_copy", "host_bf16_copy needs a trained model whose params and optimizer state are both offloaded (model %q: trained %v, offload %v, offload_optimizer %v): the copy is written by the host's AdamW", s.Model, m.Trainable, m.Offload, m.OffloadOptimizer))
	}
	if s.AccumulateGradsOnDevice.IsTrue() && m != nil && !(m.Trainable && m.OffloadOptimizer) {
		errs = append(errs, vc.Errorf("accumulate_grads_on_device", "accumulate_grads_on_device needs a trained model whose optimizer state is offloaded (model %q: trained %v, offload_optimizer %v): otherwise its grads stay on the device anyway", s.Model, m.Trainable, m.OffloadOptimizer))
	}
	if s.Replicate.IsTrue() && m != nil {
		if why := vc.Job.replicateUnsupported(m); why != "" {
			errs = append(errs, vc.Errorf("replicate", "model %q cannot be replicated: %s", s.Model, why))
		}
	}
	if n := len(vc.Job.stagesOfKind("apply_fsdp2", func(st Stage) bool { return st.(*ApplyFSDP2).Model == s.Model })); n > 1 {
		errs = append(errs, vc.Errorf("model", "model %q is sharded by %d apply_fsdp2 stages; shard it once", s.Model, n))
	}
	return errs
}

// Plan declares the persistent sharded state.
func (s *ApplyFSDP2) Plan(pc *PlanContext) error { return pc.run(s.program) }

// Run allocates the shards and streams the checkpoint into them, or, for a
// copy whose source is sharded, copies the source's shards into them.
func (s *ApplyFSDP2) Run(ctx context.Context, rc *RunContext) error { return rc.run(ctx, s.program) }

// program declares the persistent sharded state of the model: the params
// (fp32 master for a trainable model, the compute dtype for a frozen one),
// and for a trainable model fp32 grads and AdamW m and v, each on the
// device or in pinned host memory per the offload policies. Running, it
// streams each rank's dim-0 slice of every tensor from the checkpoint
// through a pinned staging buffer into the shard (see loadShards), or,
// for a copy whose source is sharded (input "source"), copies the
// source's shards (copyShards).
func (s *ApplyFSDP2) program(p *prog) {
	m := p.job.Models[s.Model]
	src, _ := p.in("checkpoint").(*Model)
	var from *ShardState
	if m.Spec.CopyOf != "" {
		from, _ = p.in("source").(*ShardState)
	}
	if p.err != nil {
		return
	}
	dp, err := p.job.shardWorld(s.Model)
	if err != nil {
		p.fail(err)
		return
	}
	// A replica of a sharded model gathers the source's shards
	// (gatherReplica: copyShards' values) after declaring its state.
	gather := dp == 1 && from != nil && from.World != 1
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
	bf16Bytes := int64(0)
	want := make([]bool, len(units))
	if s.HostBF16Copy {
		want = hostBF16Units(p.job, m, units)
	}
	for _, u := range units {
		if want[u.ord] {
			u.BF16Off = bf16Bytes
			bf16Bytes += plan.AlignUp(2 * u.ShardElems)
		}
	}
	if from != nil {
		p.op("shard " + s.Model + " from " + m.Spec.CopyOf)
	} else {
		p.op("shard " + s.Model)
	}
	st := &ShardState{Model: m, Units: units, Fsdp: s, GradBytes: gradBytes, World: dp}
	if st.GatherOnce, err = p.job.fsdpOption(s.GatherOnce, s.Model, func(o fsdpOptions) bool { return o.gatherOnce }); err == nil {
		st.AccumulateGrads, err = p.job.fsdpOption(s.AccumulateGradsOnDevice, s.Model, func(o fsdpOptions) bool { return o.accumulateGrads })
	}
	if err == nil {
		st.OverlapReduce, err = p.job.fsdpOption(s.OverlapReduce, s.Model, func(o fsdpOptions) bool { return o.overlapReduce })
	}
	if err != nil {
		p.fail(err)
		return
	}
	var staging *ref
	if from == nil {
		staging = p.hostBuf(p.stage.ID+".staging", plan.Comm, gpu.F32, int(largest))
	}
	st.Params = p.persistentBytes(s.Model+".params", plan.Params, m.Offload, paramBytes)
	if m.Trainable {
		// Grads on the device live only through an update (update_grads.go).
		if m.OffloadOptimizer {
			st.Grads = p.persistentBytes(s.Model+".grads", plan.Grads, true, gradBytes)
		}
		st.AdamM = p.persistentBytes(s.Model+".adam_m", plan.Optimizer, m.OffloadOptimizer, gradBytes)
		st.AdamV = p.persistentBytes(s.Model+".adam_v", plan.Optimizer, m.OffloadOptimizer, gradBytes)
	}
	if bf16Bytes > 0 {
		st.HostBF16 = p.persistentBytes(s.Model+".params_bf16", plan.Params, true, bf16Bytes)
	}
	if p.job.Spec.Train.CheckpointAsync {
		bytes := paramBytes
		if m.Trainable {
			st.SnapM, st.SnapV = paramBytes, paramBytes+gradBytes
			bytes += 2 * gradBytes
		}
		st.Snapshot = p.persistentBytes(s.Model+".snapshot", plan.IO, true, bytes)
	}
	if gather {
		p.do(func() error { return zeroShards(p.r.B, st) })
		gatherReplica(p, from, st, "gather "+m.Spec.CopyOf+" into the replica "+s.Model)
		p.out("weights", st)
		return
	}
	p.do(func() error {
		var err error
		if from != nil {
			err = copyShards(p, st, from)
		} else {
			err = loadShards(p, st, src, staging.t)
		}
		if err != nil || st.HostBF16 == nil {
			return err
		}
		if err := p.r.B.Sync(); err != nil {
			return err
		}
		return st.refreshBF16(p.r.Host)
	})
	p.out("weights", st)
}

// hostBF16Units reports, by unit ordinal, which units of model m keep a
// bf16 copy of their master params in pinned host memory (ShardState.
// HostBF16) under host_bf16_copy, which validation accepts only for a
// trained model whose params and optimizer state are both offloaded.
// AdamW then runs on the host and writes
// the copy as it updates each unit (2 bytes an element more to write), and
// the device's gathers of a unit computed in bf16 copy it, half the fp32
// master's bytes across PCIe and no staging buffer on one rank, instead
// of casting the master on the device: the same bits. A unit has one when
// some stage's precision policy gives bf16 for a unit whose gather reads
// its shard (a tied head reads the embedding's).
func hostBF16Units(j *Job, m *Model, units []*Unit) []bool {
	want := make([]bool, len(units))
	for _, u := range units {
		for _, st := range j.Order {
			// A policy that fails here fails validation, at the stage
			// that computes with the unit.
			if dt, err := j.Precision(m, u.Unit, st); err != nil || dt != "bf16" {
				continue
			}
			for _, sl := range u.Slots {
				o := u
				if sl.Tied {
					o = units[0]
				}
				want[o.ord] = true
			}
			break
		}
	}
	return want
}

// copyShards zeroes the sharded state and copies the params of from, the
// sharded model st is a copy of, into st's (cast to st's stored dtype on
// the device). Both have the same units (one config, one mesh), and from's
// params are as its checkpoint loaded them (setup stages run before any
// step; a resumed run restores both afterwards), so st holds what reading
// the checkpoint would give it: a bf16 checkpoint's values are exact in
// an fp32 master, and any cast rounds as the load's own would.
func copyShards(p *prog, st, from *ShardState) error {
	if err := zeroShards(p.r.B, st); err != nil {
		return err
	}
	return copyParams(p.r.B, st, from)
}

// zeroShards zeroes st's params, grads and AdamW moments.
func zeroShards(b gpu.Backend, st *ShardState) error {
	for _, r := range []*ref{st.Params, st.Grads, st.AdamM, st.AdamV} {
		if r != nil {
			if err := b.Zero(r.t); err != nil {
				return err
			}
		}
	}
	return nil
}

// copyParams copies the params of from into to, unit by unit, cast to to's
// stored dtypes; the two have the same units.
func copyParams(b gpu.Backend, to, from *ShardState) error {
	if len(from.Units) != len(to.Units) {
		return fmt.Errorf("copying %s into %s: %d units against %d", from.Model.Name(), to.Model.Name(), len(from.Units), len(to.Units))
	}
	for i, u := range from.Units {
		v := to.Units[i]
		if u.ShardElems != v.ShardElems {
			return fmt.Errorf("copying %s into %s: unit %s has %d elements a shard against %d", from.Model.Name(), to.Model.Name(), u.Name, u.ShardElems, v.ShardElems)
		}
		src, err := section(from.Params.t, u.Off, u.Master, u.ShardElems)
		if err != nil {
			return err
		}
		dst, err := section(to.Params.t, v.Off, v.Master, v.ShardElems)
		if err != nil {
			return err
		}
		if err := b.Copy(dst, src); err != nil {
			return fmt.Errorf("unit %s: %w", u.Name, err)
		}
	}
	return nil
}

// loadShards zeroes the sharded state and reads this rank's rows of every
// tensor into the params. The rows are read as stored (bf16, f16 or f32:
// no conversion on the host) straight into the pinned staging buffer, and
// the device converts them as it copies them into the shard. The staging
// buffer holds the largest slot in fp32, so for 2-byte checkpoints it is
// used as two halves: the next slot is read from disk into one half while
// the device copies the previous one out of the other.
func loadShards(p *prog, st *ShardState, src *Model, staging gpu.Tensor) error {
	b, rank, dp := p.r.B, p.r.ID, st.World
	if dp == 1 {
		rank = 0 // a replica: every rank reads all of it
	}
	load := newShardLoad(p, st, src.Checkpoint, rank)
	if err := zeroShards(b, st); err != nil {
		return err
	}
	ck := src.Checkpoint
	if ck == nil {
		return fmt.Errorf("model %q has no weights to load", src.Name())
	}
	raw, err := staging.HostBytes()
	if err != nil {
		return fmt.Errorf("loading %s: staging: %w", src.Name(), err)
	}
	stream := b.DefaultStream()
	half := len(raw) / 2 &^ (plan.Align - 1) // aligned for any dtype
	var pending [2]gpu.Event                 // the copy last reading each half
	wait := func(h int) error {
		if pending[h] == nil {
			return nil
		}
		err := pending[h].Sync()
		pending[h].Close()
		pending[h] = nil
		return err
	}
	defer func() {
		for h := range pending {
			if pending[h] != nil {
				pending[h].Sync()
				pending[h].Close()
			}
		}
	}()
	next := 0
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
			dt, err := ck.StoredDType(s.Name)
			if err != nil {
				return fmt.Errorf("rank %d of %d: %w", rank, dp, err)
			}
			n := int((r1 - r0) * s.RowElems())
			bytes := n * dt.Size()
			// A slot that fits half the buffer alternates halves; a larger
			// one (fp32) takes the whole buffer once both halves are free,
			// and its copy is waited for at once.
			h, whole := next, bytes > half
			if whole {
				h = 0
				if err := wait(1); err != nil {
					return err
				}
			}
			if err := wait(h); err != nil {
				return err
			}
			off := h * half
			if err := ck.ReadRowsRaw(s.Name, r0, r1, raw[off:off+bytes]); err != nil {
				return fmt.Errorf("rank %d of %d: %w", rank, dp, err)
			}
			stg := gpu.Tensor{Mem: staging.Mem, Off: staging.Off + int64(off), DType: dt, Shape: []int{n}}
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
			load.add(bytes)
			if whole {
				if err := stream.Sync(); err != nil {
					return err
				}
				continue
			}
			if pending[h], err = stream.Record(); err != nil {
				return err
			}
			next = 1 - h
		}
	}
	return nil
}
