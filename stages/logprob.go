package stages

import (
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
)

// DefaultChunkTokens is the default number of tokens whose logits are
// materialised at once by the log-prob stages.
const DefaultChunkTokens = 1024

// LogProb holds what the two log-prob kinds (ref_logprob, actor_logprob)
// share: their parameters and their program. Each computes the per-token
// log-probs (and, with entropy, entropies) of every response token of the
// step's batch with the model's weights as they are when the step starts,
// and shares them with every rank: stage "logp" output holds the whole
// batch's values on every rank, whatever rank computed them.
type LogProb struct {
	Model           string       `yaml:"model"`
	ChunkTokens     spec.AutoInt `yaml:"chunk_tokens"` // auto by default (see Plan)
	Entropy         bool         `yaml:"entropy"`
	EntropyTempered bool         `yaml:"entropy_tempered"` // entropy of softmax(z/T) instead of softmax(z)
}

// logProbStage is a stage of either log-prob kind.
type logProbStage interface{ logProb() *LogProb }

// logProb returns the parameters the two kinds share (logProbStage).
func (s *LogProb) logProb() *LogProb { return s }

// ports declares the batch and weights inputs and the logp (and entropy)
// outputs of the given types.
func (s *LogProb) ports(logp, entropy string) Ports {
	p := Ports{
		In: []Input{
			{Port: Port{Name: "batch", Type: TypeBatch}},
			{Port: Port{Name: "weights", Type: TypeWeights(s.Model)}, AtPhaseStart: true},
		},
		Out: []Port{{Name: "logp", Type: logp}},
	}
	if s.Entropy {
		p.Out = append(p.Out, Port{Name: "entropy", Type: entropy})
	}
	return p
}

// validate checks the model and the chunk size.
func (s *LogProb) validate(vc *ValidateContext) spec.Errors {
	_, errs := vc.model("model", s.Model)
	errs = append(errs, checkChunk(vc, s.ChunkTokens)...)
	return errs
}

// checkChunk checks a chunk_tokens parameter: auto, or 1 to maxTokensBound.
func checkChunk(vc *ValidateContext, c spec.AutoInt) spec.Errors {
	if c.IsAuto() || c >= 1 && c <= maxTokensBound {
		return nil
	}
	return spec.Errors{vc.Errorf("chunk_tokens", "chunk_tokens must be auto or in [1, %d], got %d", maxTokensBound, int(c))}
}

// respBound bounds the response tokens of a step's rollout batch.
func respBound(sp *spec.Spec) int {
	return sp.Data.RolloutSamples() * sp.Data.MaxSeqLen
}

// program runs the model's forward over this rank's micro-batches of the
// batch, gathers every response token's values into one device buffer laid
// out as the batch's TokenValues, sums it over the ranks (each token is
// written by exactly one rank, the others hold 0: with mesh.cp > 1 the
// rank of its cp group whose rows score it), and downloads it.
func (s *LogProb) program(p *prog) {
	b, _ := p.in("batch").(*Batch)
	p.unitWise = true // the decoder waits for each unit's pending update
	st, _ := p.in("weights").(*ShardState)
	if p.err != nil {
		return
	}
	chunk, err := p.job.chunkTokens(p.stage.ID, s.ChunkTokens)
	if err != nil {
		p.fail(err)
		return
	}
	d := newDecoder(p, st, b.Tokens, chunk, s.EntropyTempered)
	outputs := 1
	if s.Entropy {
		outputs = 2
	}
	bound := respBound(p.job.Spec)
	p.op("clear values")
	vals := p.buf(p.stage.ID+".values", plan.IO, gpu.F32, outputs*bound)
	p.do(func() error {
		if p.job.Spec.Mesh.WorldSize() == 1 {
			return nil // every value is written below
		}
		return p.r.B.Zero(vals.t)
	})
	kept := d.planKept()
	start := p.now() + 1
	micro := d.microBatches(b)
	for mb := range micro {
		if mb > 0 {
			p.rewind(start)
		}
		d.setBatch(micro[mb])
		d.keptFilled = mb > 0
		io := d.inputs(false, s.Entropy)
		d.forward(false)
		last := d.headForward(false)
		until(last, io...)
		p.do(func() error {
			srcs := []gpu.Tensor{d.io.logp.t}
			if s.Entropy {
				srcs = append(srcs, d.io.entropy.t)
			}
			for k, src := range srcs {
				for _, sp := range d.responseSpans(b) {
					sv, err := src.Flat(sp.from, sp.from+sp.n)
					if err != nil {
						return err
					}
					dv, err := vals.t.Flat(k*bound+sp.to, k*bound+sp.to+sp.n)
					if err != nil {
						return err
					}
					if err := p.r.B.Copy(dv, sv); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	p.op("share values")
	until(p.now(), append(kept, vals)...)
	outs := make([]*TokenValues, outputs)
	for k := range outs {
		outs[k] = &TokenValues{}
	}
	p.do(func() error {
		r := p.r
		n := b.RespTokens()
		if r.Comm.Size() > 1 {
			all, err := vals.t.Flat(0, outputs*bound)
			if err != nil {
				return err
			}
			if err := r.Comm.AllReduce(p.ctx, all, nccl.Sum); err != nil {
				return fmt.Errorf("all-reduce: %w", err)
			}
		}
		for k, o := range outs {
			v, err := vals.t.Flat(k*bound, k*bound+n)
			if err != nil {
				return err
			}
			o.Values = make([]float32, n)
			if err := r.B.Download(o.Values, v); err != nil {
				return err
			}
		}
		return nil
	})
	p.out("logp", outs[0])
	if s.Entropy {
		p.out("entropy", outs[1])
	}
}
