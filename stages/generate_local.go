package stages

import (
	"fmt"
	"math"
	"slices"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/stages/rollout"
)

// The local engine samples with rlpipe's own forward, without a KV cache:
// for every new token it runs the whole sequences again, so it is for tiny
// models, tests and the embedded default, not for real models. Every rank
// samples its share of the step's sequences (sample k on rank k mod dp),
// token by token in lockstep: at each position the ranks agree on the
// number of micro-batches (a max over the ranks), so that the FSDP
// all-gathers of every forward pair up.

// sampleLocal declares (and runs) the local engine's loop, filling mine
// with this rank's samples.
func (s *Generate) sampleLocal(p *prog, st *ShardState, pb *PromptBatch, mine map[int]*generated) {
	sp := p.job.Spec
	d := newDecoder(p, st, sp.Data.MaxTokensPerGPU, s.ChunkTokens, false)
	n, dp := sp.Data.SamplesPerPrompt, sp.Mesh.DP
	stop := s.stopSet(p.job)
	temp := sp.Data.Temperature
	var seqs []int // this rank's batch indices
	if p.running() {
		for k := p.r.ID; k < len(pb.Prompts)*n; k += dp {
			seqs = append(seqs, k)
			mine[k] = &generated{finish: "length"}
		}
	}
	active := func() []int {
		var out []int
		for _, k := range seqs {
			if g := mine[k]; len(g.tokens) < s.MaxNewTokens && g.finish != "stop" {
				out = append(out, k)
			}
		}
		return out
	}
	positions := 1 // while planning: one position, one micro-batch
	if p.running() {
		positions = s.MaxNewTokens
	}
	first := p.now() + 1
	for t := 0; t < positions && p.err == nil; t++ {
		if t > 0 {
			p.rewind(first)
		}
		p.op("count micro-batches")
		counts := p.buf(p.stage.ID+".counts", plan.Comm, gpu.F32, dp)
		var micro []*rollout.Packed
		var order [][]int // batch indices of each micro-batch's sequences
		m := 1
		p.do(func() error {
			var err error
			micro, order, err = s.packActive(pb, n, mine, active(), sp.Data.MaxTokensPerGPU)
			if err != nil {
				return err
			}
			m, err = maxOverRanks(p, counts.t, len(micro))
			return err
		})
		if p.running() && p.err != nil {
			return
		}
		done := m == 0
		start := p.now() + 1
		for mb := range max(m, 1) {
			if mb > 0 {
				p.rewind(start)
			}
			var pk *rollout.Packed
			var ks []int
			if p.running() {
				if mb < len(micro) {
					pk, ks = micro[mb], order[mb]
				} else if pk, p.err = rollout.Pack(nil, nil); p.err != nil {
					return
				}
			}
			d.setBatch(pk)
			io := d.inputs(false, false)
			d.forward(false)
			last := d.headLogits(func(lo int, logits []float32) error {
				V := d.cfg.VocabSize
				for r := 0; r*V < len(logits); r++ {
					k := ks[lo+r]
					g := mine[k]
					u := rollout.NewRand(sp.Train.Seed, uint64(p.r.Step), uint64(k), uint64(len(g.tokens))).Float64()
					tok, lp := sampleToken(logits[r*V:(r+1)*V], temp, s.TopP, s.TopK, u)
					g.tokens = append(g.tokens, tok)
					g.logprobs = append(g.logprobs, lp)
					if stop[tok] {
						g.finish = "stop"
					}
				}
				return nil
			})
			until(last, io...)
		}
		if done {
			break
		}
	}
}

// packActive packs the active sequences (prompt, the tokens so far, and
// one placeholder whose logits position is the last real token) into
// micro-batches of at most budget tokens.
func (s *Generate) packActive(pb *PromptBatch, n int, mine map[int]*generated, active []int, budget int) ([]*rollout.Packed, [][]int, error) {
	samples := make([]rollout.Sample, len(active))
	for i, k := range active {
		g := mine[k]
		prompt := pb.Prompts[k/n].Tokens
		toks := append(append(slices.Clone(prompt), g.tokens...), 0)
		samples[i] = rollout.Sample{Tokens: toks, ResponseLength: 1, LossMask: []float32{1}, Index: i}
	}
	idx := make([]int, len(samples))
	for i := range idx {
		idx[i] = i
	}
	bins, err := rollout.MicroBatches(rollout.Lengths(samples), idx, budget)
	if err != nil {
		return nil, nil, err
	}
	var micro []*rollout.Packed
	var order [][]int
	for _, b := range bins {
		pk, err := rollout.Pack(samples, b)
		if err != nil {
			return nil, nil, err
		}
		ks := make([]int, len(b))
		for j, i := range b {
			ks[j] = active[i]
		}
		micro, order = append(micro, pk), append(order, ks)
	}
	return micro, order, nil
}

// maxOverRanks returns the largest v of any rank, through t (dp floats).
func maxOverRanks(p *prog, t gpu.Tensor, v int) (int, error) {
	r := p.r
	host := make([]float32, t.Numel())
	host[r.ID] = float32(v)
	if err := r.B.Upload(t, host); err != nil {
		return 0, err
	}
	if r.Comm.Size() > 1 {
		if err := r.Comm.AllReduce(p.ctx, t, nccl.Max); err != nil {
			return 0, fmt.Errorf("all-reduce: %w", err)
		}
	}
	if err := r.B.Download(host, t); err != nil {
		return 0, err
	}
	return int(slices.Max(host)), nil
}

// sampleToken draws a token from softmax(z/T) restricted to the top-k
// tokens and then to the smallest set of most likely tokens whose mass
// reaches top-p, with the uniform draw u, and returns it with its log-prob
// under the whole softmax(z/T), the quantity rlpipe's log-prob stages
// compute.
func sampleToken(z []float32, temp, topP float64, topK int, u float64) (int32, float32) {
	v := len(z)
	x := make([]float64, v)
	m := math.Inf(-1)
	for i, zi := range z {
		x[i] = float64(zi) / temp
		m = math.Max(m, x[i])
	}
	var sum float64
	for i := range x {
		sum += math.Exp(x[i] - m)
	}
	logZ := m + math.Log(sum)
	ids := make([]int, v)
	for i := range ids {
		ids[i] = i
	}
	if topK > 0 && topK < v || topP < 1 {
		slices.SortStableFunc(ids, func(a, b int) int {
			switch {
			case x[a] > x[b]:
				return -1
			case x[a] < x[b]:
				return 1
			}
			return 0
		})
		if topK > 0 && topK < v {
			ids = ids[:topK]
		}
		if topP < 1 {
			var mass float64
			for j, i := range ids {
				mass += math.Exp(x[i] - logZ)
				if mass >= topP {
					ids = ids[:j+1]
					break
				}
			}
		}
	}
	var kept float64
	for _, i := range ids {
		kept += math.Exp(x[i] - logZ)
	}
	target := u * kept
	pick := ids[len(ids)-1]
	var acc float64
	for _, i := range ids {
		acc += math.Exp(x[i] - logZ)
		if acc > target {
			pick = i
			break
		}
	}
	return int32(pick), float32(x[pick] - logZ)
}

// headLogits selects the rows at the micro-batch's logit positions (one per
// sequence: its last real token), normalises them, and computes their
// logits a chunk of rows at a time, passing each chunk to fn on the host
// (running): the rows from lo, V logits each. It returns the index of its
// last op.
func (d *decoder) headLogits(fn func(lo int, logits []float32) error) int {
	h, ch, logits := d.headRows("head logit chunks")
	V := d.cfg.VocabSize
	d.p.do(func() error {
		w, err := d.headWeights(h)
		if err != nil {
			return err
		}
		host := make([]float32, d.C*V)
		for lo := 0; lo < d.N; lo += d.C {
			hi := min(lo+d.C, d.N)
			if err := d.cfg.HeadLogits(d.b(), w, d.head.rows.t, d.head.xn.t, d.head.rstd.t, logits.t, lo, hi); err != nil {
				return err
			}
			out, err := logits.t.Flat(0, (hi-lo)*V)
			if err != nil {
				return err
			}
			if err := d.b().Download(host[:(hi-lo)*V], out); err != nil {
				return err
			}
			if err := fn(lo, host[:(hi-lo)*V]); err != nil {
				return err
			}
		}
		return nil
	})
	d.untilGathered(ch, d.gathered[h])
	return ch
}
