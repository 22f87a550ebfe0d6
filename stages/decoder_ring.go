package stages

import (
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/runtime/plan"
)

// Context parallelism in the decoder. With mesh.cp > 1 the ranks of a cp
// group run the same micro-batches, each on its zigzag part of every
// sequence (rollout.CPShard): the embedding, norms, projections and MLP
// work on the rank's rows alone; attention is ring attention, keys and
// values passed round the group (Rank.Ring); the head scores the response
// tokens whose logits fall in the rank's rows. The loss gathers the whole
// micro-batch's log-probs and entropies over the group (every rank of it
// computes the same loss), and each rank's backward then yields its rows'
// part of the grads, which the reduce-scatter over all dp × cp ranks sums.

// ringBufs declares the ring attention scratch of unit u in compute dtype
// dt, named with tag, for the forward or the backward: live at op at while
// planning (at < 0: the current op). Running it returns the scratch; nil
// when cp is 1 or while planning.
func (d *decoder) ringBufs(u *Unit, dt gpu.DType, tag string, backward bool, at int) *model.RingScratch {
	if d.cp == 1 {
		return nil
	}
	c := d.cfg
	T, kv, q := d.T, []int{d.T, c.NumKVHeads, c.HeadDim}, []int{d.T, c.NumHeads, c.HeadDim}
	sc := &model.RingScratch{}
	type want struct {
		name  string
		field *gpu.Tensor
		dt    gpu.DType
		shape []int
	}
	ws := []want{{"k", &sc.K, dt, kv}, {"v", &sc.V, dt, kv}, {"k2", &sc.K2, dt, kv}, {"v2", &sc.V2, dt, kv}}
	if backward {
		ws = append(ws, want{"dq", &sc.DQ, dt, q}, want{"dk", &sc.DK, dt, kv}, want{"dv", &sc.DV, dt, kv},
			want{"dk2", &sc.DK2, dt, kv}, want{"dv2", &sc.DV2, dt, kv}, want{"bk", &sc.BK, dt, kv}, want{"bv", &sc.BV, dt, kv})
	} else {
		ws = append(ws, want{"out", &sc.Out, dt, q}, want{"lse", &sc.LSE, gpu.F32, []int{c.NumHeads, T}})
	}
	p := d.p
	for _, w := range ws {
		name := d.name(tag, u.Name, "ring_"+w.name)
		if !p.running() {
			if at < 0 {
				at = p.now()
			}
			p.b.Alloc(name, plan.Activations, int64(w.dt.Size())*numel(w.shape), at, at)
			continue
		}
		*w.field = p.buf(name, plan.Activations, w.dt, w.shape...).t
	}
	if !p.running() {
		return nil
	}
	return sc
}

// ringAttention returns the batch's attention and its backward as ring
// attention over the rank's cp group, with scratch sc.
func (d *decoder) ringAttention(sc *model.RingScratch) (fwd func(out, lse, q, k, v gpu.Tensor, scale float32) error,
	bwd func(dq, dk, dv, dout, out, lse, q, k, v gpu.Tensor, scale float32) error) {
	rb := func() (model.RingBackend, error) {
		b, ok := d.b().(model.RingBackend)
		if !ok {
			return nil, fmt.Errorf("mesh.cp %d: backend %T has no span attention for ring attention", d.cp, d.b())
		}
		if sc == nil || d.sh == nil || d.p.r.Ring == nil {
			return nil, fmt.Errorf("mesh.cp %d: ring attention without its scratch, shard or ring", d.cp)
		}
		return b, nil
	}
	fwd = func(out, lse, q, k, v gpu.Tensor, scale float32) error {
		b, err := rb()
		if err != nil {
			return err
		}
		return model.RingAttentionForward(d.p.ctx, b, d.p.r.Ring, d.sh.Layout, out, lse, q, k, v, d.io.cu.t, sc, scale)
	}
	bwd = func(dq, dk, dv, dout, out, lse, q, k, v gpu.Tensor, scale float32) error {
		b, err := rb()
		if err != nil {
			return err
		}
		return model.RingAttentionBackward(d.p.ctx, b, d.p.r.Ring, d.sh.Layout, dq, dk, dv, dout, out, lse, q, k, v, d.io.cu.t, sc, scale)
	}
	return fwd, bwd
}

// uploadShard uploads the rank's part of the micro-batch: its rows'
// tokens and positions, the local sequence offsets, and the targets and
// logit rows of the response tokens it scores.
func (d *decoder) uploadShard() error {
	b, sh, mb := d.b(), d.sh, d.mb
	targets := make([]int32, len(sh.Response))
	for x, k := range sh.Response {
		targets[x] = mb.Targets[k]
	}
	for _, up := range []struct {
		t   gpu.Tensor
		src []int32
	}{{d.io.ids.t, sh.Tokens}, {d.io.pos.t, sh.Positions}, {d.io.cu.t, sh.CuSeqlens}, {d.io.targets.t, targets}, {d.io.logitPos.t, sh.LogitRows}} {
		if err := b.UploadI32(up.t, up.src); err != nil {
			return err
		}
	}
	return nil
}

// responseBuf declares, with cp > 1, the buffer through which the loss
// gathers a micro-batch's per-token values over the cp group: outputs
// arrays of its response tokens, at most cp × the rows of a rank. nil with
// cp 1.
func (d *decoder) responseBuf(outputs int) *ref {
	if d.cp == 1 {
		return nil
	}
	return d.p.buf(d.name("cp.responses"), plan.IO, gpu.F32, outputs*d.cp*d.T)
}

// gatherResponses returns the whole micro-batch's values of each of local
// (this rank's response tokens, in sh.Response order): each rank scatters
// its own into buf, zeros elsewhere, and the cp group sums it.
func (d *decoder) gatherResponses(buf *ref, local ...[]float32) ([][]float32, error) {
	n := len(d.mb.Targets)
	host := make([]float32, len(local)*n)
	for k, vals := range local {
		for x, i := range d.sh.Response {
			host[k*n+int(i)] = vals[x]
		}
	}
	t, err := buf.t.Flat(0, len(host))
	if err != nil {
		return nil, err
	}
	b := d.b()
	if err := b.Upload(t, host); err != nil {
		return nil, err
	}
	if err := d.p.r.CP.AllReduce(d.p.ctx, t, nccl.Sum); err != nil {
		return nil, fmt.Errorf("gathering log-probs over the cp group: %w", err)
	}
	if err := b.Download(host, t); err != nil {
		return nil, err
	}
	out := make([][]float32, len(local))
	for k := range out {
		out[k] = host[k*n : (k+1)*n]
	}
	return out, nil
}

// localResponses returns the entries of full (a value per response token
// of the micro-batch) that this rank's rows score.
func (d *decoder) localResponses(full []float32) []float32 {
	if d.cp == 1 || len(full) == 0 {
		return full
	}
	out := make([]float32, len(d.sh.Response))
	for x, i := range d.sh.Response {
		out[x] = full[i]
	}
	return out
}

// span is a run of consecutive response tokens: n values from local index
// from go to the batch's token values at to.
type span struct{ from, to, n int }

// responseSpans returns where this rank's response values of the current
// micro-batch go among the batch's token values (Batch.RespOff): one span
// per sample, or with cp > 1 one per contiguous run of the tokens the rank
// scores.
func (d *decoder) responseSpans(b *Batch) []span {
	pk := d.mb
	var out []span
	if d.cp == 1 {
		for j, i := range pk.SampleIndex {
			out = append(out, span{from: pk.RespStart[j], to: b.RespOff[i], n: pk.RespStart[j+1] - pk.RespStart[j]})
		}
		return out
	}
	j := 0
	for x, k := range d.sh.Response {
		for int(k) >= pk.RespStart[j+1] {
			j++
		}
		to := b.RespOff[pk.SampleIndex[j]] + int(k) - pk.RespStart[j]
		if n := len(out); n > 0 && out[n-1].from+out[n-1].n == x && out[n-1].to+out[n-1].n == to {
			out[n-1].n++
			continue
		}
		out = append(out, span{from: x, to: to, n: 1})
	}
	return out
}
