package stages

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages/rl"
	"github.com/rlpipe/rlpipe/stages/rollout"
)

func init() {
	Register(Kind{Name: "train", Phase: spec.Step,
		Doc: "the PPO/GRPO step: mini-batch updates over ppo_epochs; policy loss, KL, entropy; backward; grad clip; AdamW",
		New: func() Stage { return NewTrain() }})
}

var _ Stage = (*Train)(nil)

// Train runs the step's optimizer updates: it computes the advantages over
// the rollout batch, then for each of train.ppo_epochs epochs cuts the
// batch (in rollout order, or shuffled) into mini-batches of
// data.global_batch_size samples, and for each mini-batch accumulates the
// gradients of its micro-batches, clips them and takes an AdamW step. The
// parameters of its `with:` block select the RL math of docs/rl.md.
type Train struct {
	Model              string       `yaml:"model"`
	ChunkTokens        spec.AutoInt `yaml:"chunk_tokens"` // auto by default (see Plan)
	Advantage          string       `yaml:"advantage"`    // grpo | reinforce++ | gspo
	NormalizeStd       bool         `yaml:"normalize_std"`
	PolicyLoss         string       `yaml:"policy_loss"` // ppo | cispo
	EpsClip            float64      `yaml:"eps_clip"`
	EpsClipHigh        float64      `yaml:"eps_clip_high"` // 0: same as eps_clip
	DualClipC          float64      `yaml:"dual_clip_c"`   // 0: off
	KL                 string       `yaml:"kl"`            // "" | k1 | k2 | k3 | low_var_kl
	KLCoef             float64      `yaml:"kl_coef"`
	KLUnbiased         bool         `yaml:"kl_unbiased"`
	EntropyCoef        float64      `yaml:"entropy_coef"`
	EntropyTempered    bool         `yaml:"entropy_tempered"` // entropy of softmax(z/T) instead of softmax(z) (slime: off)
	Aggregation        string       `yaml:"aggregation"`      // sample_mean | token_sum | token_mean | seq_mean_token_sum_norm
	LossNormLen        int          `yaml:"loss_norm_len"`
	UseRolloutLogProbs bool         `yaml:"use_rollout_log_probs"`
	TIS                string       `yaml:"tis"` // "" | truncate | mask
	TISCap             float64      `yaml:"tis_cap"`
	// Batch, Ref and Old name the stages that feed the inputs of the same
	// names, where more than one could (see Ports).
	Batch string `yaml:"batch"`
	Ref   string `yaml:"ref"`
	Old   string `yaml:"old"`

	// observe, when set (by tests), sees every micro-batch's loss inputs
	// and outputs, on every rank.
	observe func(lossEvent)
}

// lossEvent is one micro-batch's loss as Train.observe sees it.
type lossEvent struct {
	rank, step int
	up         update
	pk         *rollout.Packed
	in         *rl.Batch
	out        rl.Output
}

// NewTrain returns the train stage with its defaults (slime's).
func NewTrain() *Train {
	return &Train{Model: "actor", ChunkTokens: spec.Auto, Advantage: "grpo", NormalizeStd: true,
		PolicyLoss: rl.PolicyLossPPO, EpsClip: 0.2, Aggregation: rl.AggSampleMean}
}

// Ports declares the inputs: the batch, the model's weights, the reference
// log-probs when a KL term is on, and the old log-probs (optional: without
// them and without use_rollout_log_probs, l_old is the update's own
// detached log-probs, which is exact only for the step's first update, so
// Validate requires them when a step makes several). It writes the model's
// weights.
func (s *Train) Ports(*spec.Spec) Ports {
	in := []Input{
		{Port: Port{Name: "batch", Type: TypeBatch}},
		{Port: Port{Name: "weights", Type: TypeWeights(s.Model)}},
	}
	if s.KL != "" {
		in = append(in, Input{Port: Port{Name: "ref", Type: TypeRefLogProbs}})
	}
	if !s.UseRolloutLogProbs {
		in = append(in, Input{Port: Port{Name: "old", Type: TypeOldLogProbs}, Optional: true})
	}
	return Ports{In: in, Out: []Port{{Name: "weights", Type: TypeWeights(s.Model)}}}
}

func (s *Train) lossConfig() rl.LossConfig {
	return rl.LossConfig{Advantage: s.Advantage, NormalizeStd: s.NormalizeStd, EpsClip: s.EpsClip, EpsClipHigh: s.EpsClipHigh,
		DualClipC: s.DualClipC, KL: s.KL, KLCoef: s.KLCoef, KLUnbiased: s.KLUnbiased, EntropyCoef: s.EntropyCoef,
		Aggregation: s.Aggregation, LossNormLen: s.LossNormLen, PolicyLoss: s.PolicyLoss,
		UseRolloutLogProbs: s.UseRolloutLogProbs, TIS: s.TIS, TISCap: s.TISCap}
}

// Validate checks the model, the loss parameters, and that the inputs the
// loss needs are fed.
func (s *Train) Validate(vc *ValidateContext) spec.Errors {
	m, errs := vc.model("model", s.Model)
	if m != nil && m.Spec.Role != "actor" {
		errs = append(errs, vc.Errorf("model", "train updates model %q whose role is %q; only the actor is trained", s.Model, m.Spec.Role))
	}
	errs = append(errs, checkChunk(vc, s.ChunkTokens)...)
	cfg := s.lossConfig()
	if err := cfg.Validate(); err != nil {
		// The message starts with the offending key: "eps_clip: ...".
		key, _, _ := strings.Cut(err.Error(), ":")
		errs = append(errs, vc.Errorf(key, "%v", err))
	}
	if s.Ref != "" && s.KL == "" {
		errs = append(errs, vc.Errorf("ref", "ref names the reference log-probs of the KL term, but kl is not set"))
	}
	if s.Old != "" && s.UseRolloutLogProbs {
		errs = append(errs, vc.Errorf("old", "old names the actor's log-probs, but use_rollout_log_probs makes l_old the rollout's"))
	}
	sp := vc.Job.Spec
	hasOld := vc.Input("old") != nil
	switch {
	case s.UseRolloutLogProbs || hasOld || vc.Node == nil:
	case s.TIS != "":
		errs = append(errs, vc.Errorf("tis", "tis weighs by exp(l_old − l_rollout) with l_old the actor's log-probs before the step: add an actor_logprob stage"))
	case sp.UpdatesPerStep() > 1:
		errs = append(errs, spec.Errorf(vc.Stage.UsesPos, "stage %q makes %d updates per step (train.ppo_epochs %d × %d mini-batches of data.global_batch_size %d in a rollout batch of %d): the ratio needs the log-probs from before the step's first update; add an actor_logprob stage, or set use_rollout_log_probs",
			vc.Stage.ID, sp.UpdatesPerStep(), sp.Train.PPOEpochs, sp.Data.RolloutSamples()/max(sp.Data.GlobalBatchSize, 1), sp.Data.GlobalBatchSize, sp.Data.RolloutSamples()))
	}
	return errs
}

// Plan declares one update of one micro-batch: forward, loss, backward,
// the grad reductions and the optimizer step. Every update of every step
// runs through these ops again; nothing is allocated per update.
func (s *Train) Plan(pc *PlanContext) error { return pc.run(s.program) }

// Run makes the step's updates on this rank.
func (s *Train) Run(ctx context.Context, rc *RunContext) error { return rc.run(ctx, s.program) }

// update is one optimizer update of a step.
type update struct {
	Index     int // 0-based over the run: the schedule's and AdamW's step
	Epoch     int // 1-based
	MiniBatch int // 1-based within the epoch
	Samples   []int
	micro     []*rollout.Packed // this rank's micro-batches
	norm      rl.Norm
}

// stepInputs are what the loss reads besides the model's outputs.
type stepInputs struct {
	batch    *Batch
	adv      []float64 // by batch index
	ref, old *TokenValues
}

func (s *Train) program(p *prog) {
	in := stepInputs{}
	in.batch, _ = p.in("batch").(*Batch)
	p.unitWise = true // the decoder waits for each unit's pending update
	st, _ := p.in("weights").(*ShardState)
	if s.KL != "" {
		in.ref, _ = p.in("ref").(*TokenValues)
	}
	if !s.UseRolloutLogProbs {
		in.old, _ = p.in("old").(*TokenValues)
	}
	if p.err != nil {
		return
	}
	if !st.Model.Trainable {
		p.fail(fmt.Errorf("model %q is not trainable", s.Model))
		return
	}
	chunk, err := p.job.chunkTokens(p.stage.ID, s.ChunkTokens)
	if err != nil {
		p.fail(err)
		return
	}
	d := newDecoder(p, st, in.batch.Tokens, chunk, s.EntropyTempered)
	d.severalMicro = p.job.severalMicroBatches(p.job.Spec.Data.GlobalBatchSize)
	ups := []update{{micro: []*rollout.Packed{nil}}}
	if p.running() {
		var err error
		if in.adv, err = s.advantages(in.batch); err == nil {
			ups, err = s.updates(p, in)
		}
		if err != nil {
			p.fail(err)
			return
		}
	}
	first := p.now() + 1
	for u := range ups {
		if u > 0 {
			p.rewind(first)
		}
		s.update(p, d, in, &ups[u])
	}
	if p.running() && p.err == nil {
		p.r.Stats.summarize()
	}
	p.out("weights", st)
}

// update declares (and runs) one optimizer update.
func (s *Train) update(p *prog, d *decoder, in stepInputs, up *update) {
	// Every rank runs the same number of micro-batches, at least one
	// (rollout.Plan), and the first micro-batch's reduction into a grad
	// shard stores it: nothing clears the grads.
	p.op("begin update")
	d.beginUpdateGrads(up)
	var acc updateSums
	if p.running() {
		d.beginUpdate()
	}
	var ring, gacc *ref
	if d.st.Model.OffloadOptimizer {
		ring = d.planHostAdds()
		gacc = d.planGradAccumulation()
	}
	sq := d.planDeviceNorms()
	kept := d.planKept()
	d.onlyMicro = len(up.micro) == 1
	d.beginAccumulation(len(up.micro))
	early := s.early(p, d, up)
	start := p.now() + 1
	for mb, pk := range up.micro {
		if mb > 0 {
			p.rewind(start)
		}
		d.setBatch(pk)
		d.accLast = mb == len(up.micro)-1
		d.keptFilled = mb > 0
		io := d.inputs(true, true)
		d.forward(true)
		if early && mb == len(up.micro)-1 {
			d.startEarly(up)
		}
		if s.headInOnePass(d, in) {
			cl := &chunkLoss{}
			d.backwardFrom(d.headStep(func(lo, hi int) error { return s.chunkGrads(p, d, in, up, pk, cl, lo, hi) }))
			// The layers' backward is queued; the metrics need only the
			// log-probs the head step brought to the host.
			p.op("loss metrics (host)")
			p.do(func() error { return s.chunkLossEnd(p, d, in, up, pk, cl, &acc) })
		} else {
			d.headForward(true)
			p.op("loss (host)")
			gather := d.responseBuf(2)
			p.do(func() error { return s.loss(p, d, in, up, pk, gather, &acc) })
			d.backward()
		}
		until(p.now(), io...)
		if d.cpRank == 0 && pk != nil {
			acc.tokens += int64(pk.NumTokens())
		}
	}
	d.endEarly()
	s.optimize(p, d, up, &acc, early)
	until(p.now(), append(append(append(kept, ring, sq, gacc), d.grads...), d.raw...)...)
	if d.adder != nil {
		// The optimizer waited for the host adds; after an error it did not
		// run, and adds still queued must finish before the ring and the
		// grads are freed.
		_ = d.adder.wait()
	}
}

// advantages computes r̂ of every sample of the batch, once per step.
func (s *Train) advantages(b *Batch) ([]float64, error) {
	rewards := make([]float64, len(b.Samples))
	groups := make([]int, len(b.Samples))
	for k, sm := range b.Samples {
		rewards[k], groups[k] = sm.Reward, sm.Group
	}
	adv, err := rl.Advantages(rewards, groups, s.Advantage, s.NormalizeStd)
	if err != nil {
		return nil, fmt.Errorf("advantages: %w", err)
	}
	return adv, nil
}

// updates lays out the step's updates: for each epoch the batch's visiting
// order, cut into mini-batches of global_batch_size samples, each balanced
// over the dp ranks and packed into this rank's micro-batches, with the
// mini-batch's normalisers.
func (s *Train) updates(p *prog, in stepInputs) ([]update, error) {
	sp, b := p.job.Spec, in.batch
	gbs, B := sp.Data.GlobalBatchSize, len(b.Samples)
	if B == 0 || B%gbs != 0 {
		return nil, fmt.Errorf("a rollout batch of %d samples does not split into mini-batches of data.global_batch_size %d", B, gbs)
	}
	nMini := B / gbs
	perStep := sp.Train.PPOEpochs * nMini
	groups := make([]int, B)
	for k, sm := range b.Samples {
		groups[k] = sm.Group
	}
	cfg := s.lossConfig()
	lengths := b.Rows(sp.Mesh.CPSize())
	var ups []update
	for e := 0; e < sp.Train.PPOEpochs; e++ {
		order := rollout.EpochOrder(groups, sp.Train.Shuffle, sp.Train.ShuffleGroups, sp.Train.Seed, p.r.Step, e+1)
		for k := 0; k < nMini; k++ {
			up := update{Index: (p.r.Step-1)*perStep + e*nMini + k, Epoch: e + 1, MiniBatch: k + 1,
				Samples: order[k*gbs : (k+1)*gbs]}
			// Every rank's grads are scaled by the world size: the
			// reduce-scatter averages over all dp × cp ranks, which gives
			// the mean over dp of the sums over each cp group.
			up.norm = rl.Norm{DP: sp.Mesh.WorldSize(), Samples: gbs}
			for _, i := range up.Samples {
				var old, ro []float32
				if cfg.TIS != "" {
					old, ro = in.old.Values[b.RespOff[i]:b.RespOff[i+1]], b.Samples[i].RolloutLogProbs
				}
				tok, pg, err := cfg.TokenCounts(b.Samples[i].LossMask, padTo(old, b.Samples[i].ResponseLength), ro)
				if err != nil {
					return nil, err
				}
				up.norm.Tokens += tok
				up.norm.PGTokens += pg
			}
			plans, err := rollout.Plan(lengths, up.Samples, sp.Mesh.DP, b.Tokens)
			if err != nil {
				return nil, err
			}
			for _, idx := range plans[p.r.dpRank(sp.Mesh)] {
				pk, err := b.Pack(idx)
				if err != nil {
					return nil, err
				}
				up.micro = append(up.micro, pk)
			}
			ups = append(ups, up)
		}
	}
	return ups, nil
}

// padTo returns v, or a zero slice of n entries when v is nil (TokenCounts
// reads the old log-probs only under tis).
func padTo(v []float32, n int) []float32 {
	if v == nil {
		return make([]float32, n)
	}
	return v
}

// updateSums accumulates an update's metric contributions on this rank.
type updateSums struct {
	metrics rl.Metrics
	advLogP float64
	tokens  int64
}

// headInOnePass reports whether the micro-batches' head runs its forward and
// backward in one pass (decoder.headStep), computing the loss gradient a
// chunk at a time: when the loss is separable (rl.LossConfig.Separable)
// and the micro-batch is not split over a cp group, whose ranks gather the
// whole micro-batch's log-probs first. The gradients are the same bits
// either way.
func (s *Train) headInOnePass(d *decoder, in stepInputs) bool {
	return d.cp == 1 && s.lossConfig().Separable(!s.UseRolloutLogProbs && in.old == nil)
}

// chunkLoss is the host side of a micro-batch's loss under headInOnePass.
type chunkLoss struct {
	batch  *rl.Batch
	grads  *rl.TokenGrads
	dl, de []float32
}

// chunkGrads downloads the log-probs and entropies of the micro-batch's
// response tokens [lo,hi) and uploads their loss gradients (rl.TokenGrads).
func (s *Train) chunkGrads(p *prog, d *decoder, in stepInputs, up *update, pk *rollout.Packed, cl *chunkLoss, lo, hi int) error {
	b := p.r.B
	if cl.batch == nil {
		N := d.N
		batch, err := s.lossBatch(in, pk, make([]float32, N), make([]float32, N))
		if err != nil {
			return err
		}
		if cl.grads, err = rl.NewTokenGrads(s.lossConfig(), batch, up.norm); err != nil {
			return err
		}
		cl.batch, cl.dl, cl.de = batch, make([]float32, N), make([]float32, N)
	}
	for _, x := range []struct {
		t   gpu.Tensor
		dst []float32
	}{{d.io.logp.t, cl.batch.LogP}, {d.io.entropy.t, cl.batch.Entropy}} {
		src, err := x.t.Flat(lo, hi)
		if err != nil {
			return err
		}
		if err := b.Download(x.dst[lo:hi], src); err != nil {
			return err
		}
	}
	if err := cl.grads.Fill(lo, hi, cl.dl, cl.de); err != nil {
		return err
	}
	for _, x := range []struct {
		t   gpu.Tensor
		src []float32
	}{{d.io.dlogp.t, cl.dl}, {d.io.dentropy.t, cl.de}} {
		dst, err := x.t.Flat(lo, hi)
		if err != nil {
			return err
		}
		if err := b.Upload(dst, x.src[lo:hi]); err != nil {
			return err
		}
	}
	return nil
}

// chunkLossEnd computes the micro-batch's loss and metrics from the
// log-probs the head step brought to the host, and checks that the
// gradients it uploaded chunk by chunk are ComputeLoss's.
func (s *Train) chunkLossEnd(p *prog, d *decoder, in stepInputs, up *update, pk *rollout.Packed, cl *chunkLoss, acc *updateSums) error {
	batch := cl.batch
	if batch == nil { // no response token: no chunk ran
		var err error
		if batch, err = s.lossBatch(in, pk, []float32{}, []float32{}); err != nil {
			return err
		}
	}
	var out rl.Output
	if err := rl.ComputeLoss(s.lossConfig(), batch, up.norm, &out); err != nil {
		return err
	}
	for t := range cl.dl {
		if math.Float32bits(cl.dl[t]) != math.Float32bits(out.DLogP[t]) || math.Float32bits(cl.de[t]) != math.Float32bits(out.DEntropy[t]) {
			return fmt.Errorf("internal: the loss gradient of token %d computed by chunk (%v, %v) differs from the micro-batch's (%v, %v)",
				t, cl.dl[t], cl.de[t], out.DLogP[t], out.DEntropy[t])
		}
	}
	s.lossDone(p, up, pk, batch, out, true, acc)
	return nil
}

// lossBatch assembles the loss's input for micro-batch pk, with its
// response tokens' log-probs logp and entropies ent.
func (s *Train) lossBatch(in stepInputs, pk *rollout.Packed, logp, ent []float32) (*rl.Batch, error) {
	batch := &rl.Batch{LogP: logp, Entropy: ent, Mask: pk.Mask}
	S := pk.NumSamples()
	for j := 0; j < S; j++ {
		batch.Lengths = append(batch.Lengths, pk.RespStart[j+1]-pk.RespStart[j])
		batch.Advantages = append(batch.Advantages, in.adv[pk.SampleIndex[j]])
	}
	var err error
	switch {
	case s.UseRolloutLogProbs:
		if pk.RolloutLogProbs == nil {
			return nil, fmt.Errorf("use_rollout_log_probs is set but the rollouts have no rollout_log_probs")
		}
		batch.OldLogP = pk.RolloutLogProbs
	case in.old != nil:
		if batch.OldLogP, err = in.old.Gather(in.batch, pk); err != nil {
			return nil, fmt.Errorf("old log-probs: %w", err)
		}
		batch.RolloutLogP = pk.RolloutLogProbs
	default:
		batch.OldLogP = logp // one update per step: the ratio is 1 and only its gradient matters
		batch.RolloutLogP = pk.RolloutLogProbs
	}
	if s.KL != "" {
		if batch.RefLogP, err = in.ref.Gather(in.batch, pk); err != nil {
			return nil, fmt.Errorf("ref log-probs: %w", err)
		}
	}
	return batch, nil
}

// loss computes the loss of micro-batch pk on the host and uploads dL/dl
// and dL/dH. With mesh.cp > 1 every rank of the cp group gathers the
// micro-batch's log-probs and entropies through gather and computes the
// same loss; the first of them counts its metrics, and each uploads the
// gradients of the tokens it scores.
func (s *Train) loss(p *prog, d *decoder, in stepInputs, up *update, pk *rollout.Packed, gather *ref, acc *updateSums) error {
	b := p.r.B
	N := d.N
	logp, ent := make([]float32, N), make([]float32, N)
	if err := b.Download(logp, d.io.logp.t); err != nil {
		return err
	}
	if err := b.Download(ent, d.io.entropy.t); err != nil {
		return err
	}
	if d.cp > 1 {
		full, err := d.gatherResponses(gather, logp, ent)
		if err != nil {
			return err
		}
		logp, ent = full[0], full[1]
	}
	batch, err := s.lossBatch(in, pk, logp, ent)
	if err != nil {
		return err
	}
	var out rl.Output
	if err := rl.ComputeLoss(s.lossConfig(), batch, up.norm, &out); err != nil {
		return err
	}
	if err := b.Upload(d.io.dlogp.t, d.localResponses(out.DLogP)); err != nil {
		return err
	}
	if err := b.Upload(d.io.dentropy.t, d.localResponses(out.DEntropy)); err != nil {
		return err
	}
	// The group's first rank counts the micro-batch.
	s.lossDone(p, up, pk, batch, out, d.cpRank == 0, acc)
	return nil
}

// lossDone reports the loss of micro-batch pk to the observer and, when
// count, adds its metrics to acc.
func (s *Train) lossDone(p *prog, up *update, pk *rollout.Packed, batch *rl.Batch, out rl.Output, count bool, acc *updateSums) {
	if s.observe != nil {
		s.observe(lossEvent{rank: p.r.ID, step: p.r.Step, up: *up, pk: pk, in: batch, out: out})
	}
	if !count {
		return
	}
	acc.metrics.Add(out.Metrics)
	logp, S := batch.LogP, len(batch.Lengths)
	// The reward-weighted objective (1/GBS) Σ_i Â_i · mean_t m·l: what the
	// policy gradient raises (logged as adv_logp).
	for i, off := 0, 0; i < S; i++ {
		var sum, cnt float64
		for t := off; t < off+batch.Lengths[i]; t++ {
			sum += float64(batch.Mask[t]) * float64(logp[t])
			cnt += float64(batch.Mask[t])
		}
		if cnt > 0 {
			acc.advLogP += batch.Advantages[i] * sum / cnt / float64(up.norm.Samples)
		}
		off += batch.Lengths[i]
	}
}
