package stages

import (
	"fmt"
	"math"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages/rl"
)

// The layout of the optimizer op's all-reduce buffer: the squared grad
// norm, the update's tokens, adv_logp, then the loss metrics' vector.
const (
	redSumSq = iota
	redTokens
	redAdvLogP
	redMetrics
	redLen = redMetrics + rl.MetricsLen
)

// optimize declares the optimizer op: the global grad norm and the step's
// metrics are all-reduced in one small buffer, grads are clipped, and AdamW
// updates every unit's shard. When the master params and the optimizer
// state are all offloaded, the grad norm, clipping and AdamW run on the
// host (Rank.Host), where that memory is, after the device has finished the
// step's grads, and AdamW goes on in the background, unit by unit, while the
// device runs what comes next (host_update.go); when only the optimizer
// state is offloaded, the device updates each unit through staging buffers.
//
// Without clipping, an update whose AdamW started early (early; see
// host_update_early.go) is left running: the op computes the norm and
// the metrics only.
func (s *Train) optimize(p *prog, d *decoder, up *update, acc *updateSums, early bool) {
	st := d.st
	p.op("grad norm + AdamW")
	red := p.buf(p.stage.ID+".opt.reduce", plan.Comm, gpu.F32, redLen)
	onHost := st.Model.Offload && st.Model.OffloadOptimizer
	var sums *ref
	if !st.Model.OffloadOptimizer {
		// Each unit's sum of squares lands here on the device and comes
		// back in one download (unitSums), instead of a wait a unit.
		sums = p.buf(p.stage.ID+".opt.grad_sumsq", plan.Comm, gpu.I32, 2*len(st.Units))
	}
	var stage [4]*ref
	if st.Model.OffloadOptimizer && !onHost {
		var largest int64
		for _, u := range st.Units {
			largest = max(largest, u.ShardElems)
		}
		for k, nm := range []string{"grad", "m", "v", "param"} {
			if nm == "param" && !st.Model.Offload {
				continue
			}
			stage[k] = p.buf(p.stage.ID+".opt.stage."+nm, plan.Comm, gpu.F32, int(largest))
		}
	}
	p.do(func() error {
		r, b, ob := p.r, p.r.B, p.r.B
		if gradsSeen != nil && st.Grads == nil {
			if err := gradsSeen(r, st, d.gradShard); err != nil {
				return err
			}
		}
		// The previous update's AdamW has finished on every unit this
		// rank's micro-batches gathered; a rank with none gathered none.
		// An early update is this update's own, left running.
		if !early {
			if err := st.settle(); err != nil {
				return err
			}
		}
		if d.adder != nil {
			if err := d.adder.wait(); err != nil {
				return err
			}
		}
		if onHost {
			// The grads were accumulated into host memory by the device's
			// streams: wait for them.
			if err := syncAll(r); err != nil {
				return err
			}
			ob = r.Host
		}
		// The units' sums of squares: the device's, all of them (sums)
		// or those of the units it staged whole for the host
		// (deviceNorms); ob sums the others.
		var dev []float64
		fromDev := func(int) bool { return false }
		switch {
		case sums != nil:
			var err error
			if dev, err = unitSums(b, sums.t, st.Units, d.normView); err != nil {
				return err
			}
			fromDev = func(int) bool { return true }
		case onHost && d.devNorms != nil:
			var err error
			if dev, err = d.devNorms.sums(b); err != nil {
				return err
			}
			fromDev = func(ord int) bool { return d.devNorms.valid[ord] }
		}
		var sumsq float64
		served := 0
		for _, u := range st.Units {
			if fromDev(u.ord) {
				sumsq += dev[u.ord]
				served++
				continue
			}
			g, err := d.gradView(u)
			if err != nil {
				return err
			}
			ss, err := ob.SumSquares(g)
			if err != nil {
				return err
			}
			sumsq += ss
		}
		if onHost && normsServed != nil {
			normsServed(served)
		}
		vals := make([]float32, redLen)
		vals[redSumSq], vals[redTokens], vals[redAdvLogP] = float32(sumsq), float32(acc.tokens), float32(acc.advLogP)
		for k, x := range acc.metrics.Vector() {
			vals[redMetrics+k] = float32(x)
		}
		if err := b.Upload(red.t, vals); err != nil {
			return err
		}
		if r.Comm.Size() > 1 {
			if err := r.Comm.AllReduce(p.ctx, red.t, nccl.Sum); err != nil {
				return err
			}
		}
		if err := b.Download(vals, red.t); err != nil {
			return err
		}
		tr := p.job.Spec.Train
		norm := math.Sqrt(float64(vals[redSumSq]))
		coef := rl.ClipCoef(norm, tr.GradClip)
		lr := schedule(tr).At(up.Index)
		if math.IsNaN(norm) || math.IsInf(norm, 0) {
			if early {
				return fmt.Errorf("update %d (step %d, epoch %d, mini-batch %d): gradient norm is %v (without grad_clip, AdamW had already started on the host; the weights in memory are not to be used)", up.Index+1, r.Step, up.Epoch, up.MiniBatch, norm)
			}
			return fmt.Errorf("update %d (step %d, epoch %d, mini-batch %d): gradient norm is %v", up.Index+1, r.Step, up.Epoch, up.MiniBatch, norm)
		}
		step := func(u *Unit) error {
			if r := d.raw[u.ord]; r != nil {
				return adamwRaw(ob, p, st, u, r.t, coef, lr, up.Index+1)
			}
			return adamw(ob, p, st, u, d.gradView, stage, coef, lr, up.Index+1)
		}
		switch {
		case early:
			// Running since the backward began, each unit as its grads
			// arrived (coef is 1: no clipping).
		case onHost && (r.Profile != nil || r.syncHostOptimizer):
			r.startHostUpdate(p.ctx, st, step)
			if err := st.settle(); err != nil {
				return err
			}
		case onHost:
			// AdamW runs on the host's cores while the device goes on; each
			// unit's next reader waits for that unit (host_update.go).
			bg := r.hostBackground
			r.startHostUpdate(p.ctx, st, func(u *Unit) error { return adamw(bg, p, st, u, d.gradView, stage, coef, lr, up.Index+1) })
		default:
			for _, u := range st.Units {
				if err := step(u); err != nil {
					return fmt.Errorf("AdamW on %s: %w", u.Name, err)
				}
			}
		}
		mv := make([]float64, rl.MetricsLen)
		for k := range mv {
			mv[k] = float64(vals[redMetrics+k])
		}
		values := rl.MetricsFromVector(mv).Values()
		values["adv_logp"] = float64(vals[redAdvLogP])
		r.Stats.Updates = append(r.Stats.Updates, UpdateStats{Index: up.Index, Epoch: up.Epoch, MiniBatch: up.MiniBatch,
			GradNorm: norm, LR: lr, Tokens: int64(vals[redTokens]), Values: values})
		return nil
	})
}

// schedule is the learning-rate schedule of the train section; it counts
// optimizer updates.
func schedule(tr spec.Train) rl.Schedule {
	return rl.Schedule{LR: tr.LR, MinLR: tr.MinLR, WarmupInitLR: tr.WarmupInitLR, WarmupSteps: tr.WarmupSteps, DecaySteps: tr.DecaySteps, Decay: tr.Decay}
}

// bf16Updater is a host backend whose AdamW also writes the updated
// params' bf16 rounding (the CPU backend's), in one pass over the memory.
type bf16Updater interface {
	AdamWBF16(p, g, m, v, out gpu.Tensor, st gpu.AdamWStep) error
}

// adamwStep is AdamW step step (1-based) of the train section tr at
// learning rate lr, the grads clipped by coef: it scales them as AdamW
// reads them (they are not modified), 1 when the norm is within the clip.
func adamwStep(tr spec.Train, coef, lr float64, step int) gpu.AdamWStep {
	return gpu.AdamWStep{LR: lr, Beta1: tr.Betas[0], Beta2: tr.Betas[1], Eps: tr.Eps,
		WeightDecay: tr.WeightDecay, Step: step, GradScale: float32(min(coef, 1))}
}

// adamw clips and takes AdamW step step (1-based) of one unit's shard on
// backend b, reading its grads through grads (decoder.gradView).
func adamw(b gpu.Backend, p *prog, st *ShardState, u *Unit, grads func(*Unit) (gpu.Tensor, error), stage [4]*ref, coef, lr float64, step int) error {
	views := make([]gpu.Tensor, 4)
	g, err := grads(u)
	if err != nil {
		return err
	}
	views[0] = g
	for k, buf := range []*ref{st.AdamM, st.AdamV} {
		v, err := section(buf.t, u.GradOff, gpu.F32, u.ShardElems)
		if err != nil {
			return err
		}
		views[k+1] = v
	}
	pv, err := section(st.Params.t, u.Off, u.Master, u.ShardElems)
	if err != nil {
		return err
	}
	views[3] = pv
	work := append([]gpu.Tensor(nil), views...)
	for k := range work {
		if stage[k] != nil {
			sv, err := stage[k].t.Flat(0, int(u.ShardElems))
			if err != nil {
				return err
			}
			if err := b.Copy(sv, views[k]); err != nil {
				return err
			}
			work[k] = sv
		}
	}
	as := adamwStep(p.job.Spec.Train, coef, lr, step)
	if st.HostBF16 != nil && u.BF16Off >= 0 {
		// The params are in host memory and so is their bf16 copy
		// (hostBF16Units): write it as the unit is updated.
		out, err := section(st.HostBF16.t, u.BF16Off, gpu.BF16, u.ShardElems)
		if err != nil {
			return err
		}
		c, ok := b.(bf16Updater)
		if !ok {
			return fmt.Errorf("the host backend %T does not write a bf16 copy", b)
		}
		return c.AdamWBF16(work[3], work[0], work[1], work[2], out, as)
	}
	if err := b.AdamW(work[3], work[0], work[1], work[2], as); err != nil {
		return err
	}
	for k := 1; k < 4; k++ {
		if stage[k] != nil {
			if err := b.Copy(views[k], work[k]); err != nil {
				return err
			}
		}
	}
	return nil
}

// adamwRaw is adamw for a unit whose grads stay raw (rawGrads): one step
// over each run of its slots, reading the grads in their dtype from grad,
// the buffer its backward accumulated them into.
func adamwRaw(b gpu.Backend, p *prog, st *ShardState, u *Unit, grad gpu.Tensor, coef, lr float64, step int) error {
	as := adamwStep(p.job.Spec.Train, coef, lr, step)
	for _, r := range rawRuns(u) {
		g, err := section(grad, r.gathered*int64(grad.DType.Size()), grad.DType, r.elems)
		if err != nil {
			return err
		}
		pv, err := section(st.Params.t, u.Off+r.shard*int64(u.Master.Size()), u.Master, r.elems)
		if err != nil {
			return err
		}
		m, err := section(st.AdamM.t, u.GradOff+r.shard*4, gpu.F32, r.elems)
		if err != nil {
			return err
		}
		v, err := section(st.AdamV.t, u.GradOff+r.shard*4, gpu.F32, r.elems)
		if err != nil {
			return err
		}
		if err := b.AdamW(pv, g, m, v, as); err != nil {
			return err
		}
	}
	return nil
}

// syncAll waits for the rank's default, side and Down streams.
func syncAll(r *Rank) error {
	for _, s := range []gpu.Stream{r.Side, r.Down} {
		if s != nil {
			if err := s.Sync(); err != nil {
				return err
			}
		}
	}
	return r.B.Sync()
}
