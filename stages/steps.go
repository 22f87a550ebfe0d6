package stages

import (
	"context"
	"fmt"
	"math"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/stages/rl"
	"github.com/rlpipe/rlpipe/stages/rollout"
)

// packStep selects the step's samples, computes their advantages and packs
// this rank's micro-batches.
func packStep(p *prog, s *Pack) error {
	r, d := p.r, p.r.data
	if d == nil || len(d.Batches) == 0 {
		return fmt.Errorf("no rollout data")
	}
	idx := d.Batches[(r.Step-1)%len(d.Batches)]
	rewards := make([]float64, len(idx))
	groups := make([]int, len(idx))
	for k, i := range idx {
		rewards[k], groups[k] = d.Samples[i].Reward, d.Samples[i].Group
	}
	cfg := p.job.lossConfig()
	adv, err := rl.Advantages(rewards, groups, cfg.Advantage, cfg.NormalizeStd)
	if err != nil {
		return fmt.Errorf("advantages: %w", err)
	}
	r.Advantages = make(map[int]float64, len(idx))
	for k, i := range idx {
		r.Advantages[i] = adv[k]
	}
	plans, err := rollout.Plan(rollout.Lengths(d.Samples), idx, p.job.Spec.Mesh.DP, s.Tokens(p.job.Spec))
	if err != nil {
		return err
	}
	r.Micro = r.Micro[:0]
	for _, mb := range plans[r.ID] {
		pk, err := rollout.Pack(d.Samples, mb)
		if err != nil {
			return err
		}
		r.Micro = append(r.Micro, pk)
	}
	return nil
}

// lossConfig is the loss configuration of the job's train stage (the
// defaults when there is none).
func (j *Job) lossConfig() rl.LossConfig {
	for _, st := range j.stagesOfKind("train", nil) {
		return j.Stages[st.ID].(*Train).lossConfig()
	}
	return rl.DefaultLossConfig()
}

func (s *Train) lossConfig() rl.LossConfig {
	return rl.LossConfig{Advantage: s.Advantage, NormalizeStd: s.NormalizeStd, EpsClip: s.EpsClip, EpsClipHigh: s.EpsClipHigh,
		DualClipC: s.DualClipC, KL: s.KL, KLCoef: s.KLCoef, KLUnbiased: s.KLUnbiased, EntropyCoef: s.EntropyCoef,
		Aggregation: s.Aggregation, UseRolloutLogProbs: s.UseRolloutLogProbs}
}

// Plan declares one micro-batch of the chunked forward.
func (s *LogProb) Plan(pc *PlanContext) error { return pc.run(s.program) }

// Run computes the log-probs of every micro-batch of this rank.
func (s *LogProb) Run(ctx context.Context, rc *RunContext) error { return rc.run(ctx, s.program) }

func (s *LogProb) program(p *prog) {
	d := newDecoder(p, s.Model, s.ChunkTokens, s.EntropyTempered)
	if d == nil {
		return
	}
	n := d.microBatches()
	outs, ents := make([][]float32, n), make([][]float32, n)
	start := p.now() + 1
	var host *ref
	for mb := 0; mb < n; mb++ {
		if mb > 0 {
			p.rewind(start)
		}
		d.setBatch(mb)
		io := d.inputs(false, s.Entropy)
		if host == nil {
			// Per-token results go device -> pinned host: log-probs, then
			// entropies when asked for.
			outputs := 1
			if s.Entropy {
				outputs = 2
			}
			host = p.persistent(p.stage.ID+".out", plan.IO, true, gpu.F32, outputs*stepTokens(p.job.Spec))
		}
		d.forward(false)
		last := d.headForward(false)
		until(last, io...)
		p.do(func() error {
			results := []struct {
				src gpu.Tensor
				dst *[]float32
			}{{d.io.logp.t, &outs[mb]}}
			if s.Entropy {
				results = append(results, struct {
					src gpu.Tensor
					dst *[]float32
				}{d.io.entropy.t, &ents[mb]})
			}
			for k, r := range results {
				off := k * stepTokens(p.job.Spec)
				out, err := host.t.Flat(off, off+d.N)
				if err != nil {
					return err
				}
				if err := p.r.B.Copy(out, r.src); err != nil {
					return err
				}
				*r.dst = make([]float32, d.N)
				if err := p.r.B.Download(*r.dst, out); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if p.running() {
		p.r.LogP[p.stage.ID] = outs
		if s.Entropy {
			p.r.Entropy[p.stage.ID] = ents
		}
	}
}

// Plan declares one micro-batch of forward and backward and the optimizer step.
func (s *Train) Plan(pc *PlanContext) error { return pc.run(s.program) }

// Run trains on every micro-batch of this rank and takes the optimizer step.
func (s *Train) Run(ctx context.Context, rc *RunContext) error { return rc.run(ctx, s.program) }

func (s *Train) program(p *prog) {
	d := newDecoder(p, s.Model, s.ChunkTokens, s.EntropyTempered)
	if d == nil {
		return
	}
	if d.st.Grads == nil {
		p.fail(fmt.Errorf("model %q is not trainable", s.Model))
		return
	}
	n := d.microBatches()
	// The first micro-batch's reduction stores the grads; only a rank with
	// no micro-batch must clear them.
	p.op("zero grads")
	p.do(func() error {
		if n > 0 {
			return nil
		}
		return p.r.B.Zero(d.st.Grads.t)
	})
	if p.running() {
		p.r.Metrics, p.r.advLogP = rl.Metrics{}, 0
	}
	var ring *ref
	if d.st.Model.OffloadOptimizer {
		ring = d.planHostAdds()
	}
	start := p.now() + 1
	var tokens int64
	for mb := 0; mb < n; mb++ {
		if mb > 0 {
			p.rewind(start)
		}
		d.setBatch(mb)
		io := d.inputs(true, true)
		d.forward(true)
		d.headForward(true)
		p.op("loss (host)")
		p.do(func() error { return s.loss(p, d, mb) })
		d.backward()
		until(p.now(), io...)
		tokens += int64(d.T)
	}
	s.optimize(p, d, tokens)
	until(p.now(), ring)
	if d.adder != nil {
		// The optimizer waited for the host adds; after an error it did not
		// run, and adds still queued must finish before the ring and the
		// grads are freed.
		_ = d.adder.wait()
	}
}

// loss computes the loss of micro-batch mb on the host and uploads dL/dl
// and dL/dH.
func (s *Train) loss(p *prog, d *decoder, mb int) error {
	r, b, mbp := p.r, p.r.B, d.mb
	N := d.N
	logp, ent := make([]float32, N), make([]float32, N)
	if err := b.Download(logp, d.io.logp.t); err != nil {
		return err
	}
	if err := b.Download(ent, d.io.entropy.t); err != nil {
		return err
	}
	batch := &rl.Batch{LogP: logp, Entropy: ent, Mask: mbp.Mask}
	S := mbp.NumSamples()
	for i := 0; i < S; i++ {
		batch.Lengths = append(batch.Lengths, mbp.RespStart[i+1]-mbp.RespStart[i])
		batch.Advantages = append(batch.Advantages, r.Advantages[mbp.SampleIndex[i]])
	}
	cfg := s.lossConfig()
	switch {
	case s.UseRolloutLogProbs:
		if mbp.RolloutLogProbs == nil {
			return fmt.Errorf("use_rollout_log_probs is set but the rollouts have no rollout_log_probs")
		}
		batch.OldLogP = mbp.RolloutLogProbs
	case s.oldStage(p.job) != "":
		batch.OldLogP = r.LogP[s.oldStage(p.job)][mb]
	default:
		batch.OldLogP = logp // on-policy: the ratio is 1 and only its gradient matters
	}
	if cfg.KL != "" {
		batch.RefLogP = r.LogP[s.refStage(p.job)][mb]
	}
	var out rl.Output
	scale := float64(p.job.Spec.Mesh.DP) / float64(p.job.Spec.Data.GlobalBatchSize)
	if err := rl.ComputeLoss(cfg, batch, scale, &out); err != nil {
		return err
	}
	r.Metrics.Add(out.Metrics)
	// The reward-weighted objective Σ_i Â_i · mean_t m·l: what the policy
	// gradient raises (logged as adv_logp).
	for i, off := 0, 0; i < S; i++ {
		var sum, cnt float64
		for t := off; t < off+batch.Lengths[i]; t++ {
			sum += float64(batch.Mask[t]) * float64(logp[t])
			cnt += float64(batch.Mask[t])
		}
		if cnt > 0 {
			r.advLogP += batch.Advantages[i] * sum / cnt
		}
		off += batch.Lengths[i]
	}
	if err := b.Upload(d.io.dlogp.t, out.DLogP); err != nil {
		return err
	}
	return b.Upload(d.io.dentropy.t, out.DEntropy)
}

func (s *Train) oldStage(j *Job) string {
	if s.Old != "" {
		return s.Old
	}
	if l := j.stagesOfKind("actor_logprob", nil); len(l) == 1 {
		return l[0].ID
	}
	return ""
}

func (s *Train) refStage(j *Job) string {
	if s.Ref != "" {
		return s.Ref
	}
	if l := j.stagesOfKind("ref_logprob", nil); len(l) > 0 {
		return l[0].ID
	}
	return ""
}

// reduced is the layout of the optimizer op's all-reduce buffer.
const (
	redSumSq = iota
	redTokens
	redSamples
	redMaskTokens
	redLoss
	redPG
	redClip
	redDual
	redPPOKL
	redRatio
	redKL
	redEntropy
	redAdvLogP
	redLen
)

// optimize declares the optimizer op: the global grad norm and the step's
// metrics are all-reduced in one small buffer, grads are clipped, and AdamW
// updates every unit's shard. When the master params and the optimizer
// state are all offloaded, the grad norm, clipping and AdamW run on the
// host (Rank.Host), where that memory is, after the device has finished the
// step's grads; when only the optimizer state is offloaded, the device
// updates each unit through staging buffers.
func (s *Train) optimize(p *prog, d *decoder, tokens int64) {
	st := d.st
	p.op("grad norm + AdamW")
	red := p.buf(p.stage.ID+".opt.reduce", plan.Comm, gpu.F32, redLen)
	onHost := st.Model.Offload && st.Model.OffloadOptimizer
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
		var sumsq float64
		for _, u := range st.Units {
			g, err := section(st.Grads.t, u.GradOff, gpu.F32, u.ShardElems)
			if err != nil {
				return err
			}
			ss, err := ob.SumSquares(g)
			if err != nil {
				return err
			}
			sumsq += ss
		}
		m := r.Metrics
		vals := make([]float32, redLen)
		vals[redSumSq], vals[redTokens], vals[redSamples], vals[redMaskTokens] = float32(sumsq), float32(tokens), float32(m.Samples), float32(m.Tokens)
		vals[redLoss], vals[redPG], vals[redClip], vals[redDual] = float32(m.Loss), float32(m.PGLoss), float32(m.PGClipFrac), float32(m.DualClipFrac)
		vals[redPPOKL], vals[redRatio], vals[redKL], vals[redEntropy] = float32(m.PPOKL), float32(m.Ratio), float32(m.KLLoss), float32(m.EntropyLoss)
		vals[redAdvLogP] = float32(r.advLogP)
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
		sched := rl.Schedule{LR: tr.LR, MinLR: tr.MinLR, WarmupInitLR: tr.WarmupInitLR, WarmupSteps: tr.WarmupSteps, DecaySteps: tr.DecaySteps, Decay: tr.Decay}
		if sched.DecaySteps == 0 {
			sched.DecaySteps = tr.Steps
		}
		lr := sched.At(r.Step - 1)
		if math.IsNaN(norm) || math.IsInf(norm, 0) {
			return fmt.Errorf("step %d: gradient norm is %v", r.Step, norm)
		}
		for _, u := range st.Units {
			if err := adamw(ob, p, st, u, stage, coef, lr); err != nil {
				return fmt.Errorf("AdamW on %s: %w", u.Name, err)
			}
		}
		gm := rl.Metrics{Samples: int(vals[redSamples]), Tokens: float64(vals[redMaskTokens]), Loss: float64(vals[redLoss]), PGLoss: float64(vals[redPG]),
			PGClipFrac: float64(vals[redClip]), DualClipFrac: float64(vals[redDual]), PPOKL: float64(vals[redPPOKL]), Ratio: float64(vals[redRatio]),
			KLLoss: float64(vals[redKL]), EntropyLoss: float64(vals[redEntropy])}
		values, err := gm.Normalize(p.job.Spec.Data.GlobalBatchSize)
		if err != nil {
			return err
		}
		values["adv_logp"] = float64(vals[redAdvLogP]) / float64(p.job.Spec.Data.GlobalBatchSize)
		r.Stats = StepStats{GradNorm: norm, LR: lr, Tokens: int64(vals[redTokens]), Values: values}
		return nil
	})
}

// adamw clips and steps one unit's shard on backend b.
func adamw(b gpu.Backend, p *prog, st *ShardState, u *Unit, stage [4]*ref, coef, lr float64) error {
	tr := p.job.Spec.Train
	views := make([]gpu.Tensor, 4)
	for k, buf := range []*ref{st.Grads, st.AdamM, st.AdamV} {
		v, err := section(buf.t, u.GradOff, gpu.F32, u.ShardElems)
		if err != nil {
			return err
		}
		views[k] = v
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
	// The clip coefficient scales the grads as AdamW reads them (grads
	// are not modified); 1 when the norm is within the clip.
	if err := b.AdamW(work[3], work[0], work[1], work[2], gpu.AdamWStep{LR: lr, Beta1: tr.Betas[0], Beta2: tr.Betas[1], Eps: tr.Eps,
		WeightDecay: tr.WeightDecay, Step: p.r.Step, GradScale: float32(min(coef, 1))}); err != nil {
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

// syncAll waits for the rank's default and side streams.
func syncAll(r *Rank) error {
	if r.Side != nil {
		if err := r.Side.Sync(); err != nil {
			return err
		}
	}
	return r.B.Sync()
}
