package model

import (
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
)

// headArgs are the checked operands of the head.
type headArgs struct {
	n     int
	rows  gpu.Tensor // [N,H]
	xn    gpu.Tensor // [N,H]
	chunk int
}

func (c *Config) checkHead(w HeadWeights, rows, xn, rstd, targets, logits gpu.Tensor, chunk int, temperature float32) (headArgs, error) {
	var a headArgs
	h, v := c.HiddenSize, c.VocabSize
	if w.Norm.Mem == nil || !gpu.SameShape(w.Norm.Shape, []int{h}) {
		return a, fmt.Errorf("norm weight must be [%d], got %v", h, w.Norm)
	}
	if w.LMHead.Mem == nil || !gpu.SameShape(w.LMHead.Shape, []int{v, h}) {
		return a, fmt.Errorf("lm head weight must be [%d %d], got %v", v, h, w.LMHead)
	}
	if rows.Mem == nil || len(rows.Shape) == 0 || rows.Numel()%h != 0 {
		return a, fmt.Errorf("rows must be [N,%d], got %v", h, rows)
	}
	a.n = rows.Numel() / h
	var err error
	if a.rows, err = shaped("rows", rows, a.n, h); err != nil {
		return a, err
	}
	if a.rows.DType != gpu.F32 {
		return a, fmt.Errorf("rows must be f32, got %v", rows.DType)
	}
	if a.xn, err = shaped("xn", xn, a.n, h); err != nil {
		return a, err
	}
	if _, err := shaped("rstd", rstd, a.n); err != nil {
		return a, err
	}
	if _, err := shaped("targets", targets, a.n); err != nil {
		return a, err
	}
	if !(temperature > 0) {
		return a, fmt.Errorf("temperature %v must be positive", temperature)
	}
	if chunk <= 0 {
		return a, fmt.Errorf("chunk %d must be positive", chunk)
	}
	a.chunk = min(chunk, a.n)
	if logits.Mem == nil || len(logits.Shape) != 2 || logits.Shape[1] != v || logits.Shape[0] < a.chunk {
		return a, fmt.Errorf("logits workspace must be f32 [C,%d] with C >= %d, got %v", v, a.chunk, logits)
	}
	return a, nil
}

// rowsOf returns rows [lo,hi) of t viewed as n rows, or t itself when it
// is absent.
func rowsOf(t gpu.Tensor, n, lo, hi int) (gpu.Tensor, error) {
	if t.Empty() {
		return gpu.Tensor{}, nil
	}
	if t.Numel()%max(n, 1) != 0 {
		return gpu.Tensor{}, fmt.Errorf("%v does not split into %d rows", t, n)
	}
	r, err := t.Reshape(n, -1)
	if err != nil {
		return gpu.Tensor{}, err
	}
	r, err = r.Rows(lo, hi)
	if err != nil {
		return gpu.Tensor{}, err
	}
	if t.Numel() == n {
		return r.Reshape(hi - lo)
	}
	return r, nil
}

// Sampling is how the head takes log-probs and entropies from the logits.
type Sampling struct {
	// Temperature divides the logits of the log-probs (the rollout
	// temperature); it must be positive.
	Temperature float32
	// EntropyTempered takes the entropy of softmax(logits/Temperature)
	// instead of softmax(logits), slime's default.
	EntropyTempered bool
}

// HeadForward computes the log-probs (and entropies) of N target tokens.
// rows (fp32 [N,H]) are the residual-stream rows at the logit positions;
// the final RMSNorm writes xn ([N,H], compute dtype) and rstd (F32 [N]),
// which HeadBackward reuses. Then, chunk rows at a time, the logits xn·Wᵀ
// go into the F32 workspace logits ([C,V], C >= min(chunk, N)) and
// logp[i] = log_softmax(logits/s.Temperature)[targets[i]] (F32 [N]) and,
// unless entropy is the zero Tensor, entropy[i] (F32 [N]) of the logits
// (tempered when s.EntropyTempered) are written. targets is I32 [N].
// Without entropies, a backend with LogProbsFused (logProbsFuser) takes
// each chunk's log-probs without holding its logits: the workspace is then
// its scratch.
func (c *Config) HeadForward(b gpu.Backend, w HeadWeights, rows, xn, rstd, targets, logp, entropy, logits gpu.Tensor, chunk int, s Sampling) error {
	a, err := c.checkHead(w, rows, xn, rstd, targets, logits, chunk, s.Temperature)
	if err != nil {
		return fmt.Errorf("head forward: %w", err)
	}
	if err := b.RMSNorm(a.xn, rstd, a.rows, w.Norm, float32(c.RMSNormEps)); err != nil {
		return fmt.Errorf("head forward: %w", err)
	}
	for lo := 0; lo < a.n; lo += a.chunk {
		hi := min(lo+a.chunk, a.n)
		if entropy.Empty() {
			fused, err := c.headChunkFused(b, w, a, lo, hi, targets, logp, logits, s)
			if err != nil {
				return fmt.Errorf("head forward: rows [%d,%d): %w", lo, hi, err)
			}
			if fused {
				continue
			}
		}
		if err := c.headChunk(b, w, HeadWeights{}, a, lo, hi, targets, logp, entropy, gpu.Tensor{}, logits, gpu.Tensor{}, s, chunkForward); err != nil {
			return fmt.Errorf("head forward: rows [%d,%d): %w", lo, hi, err)
		}
	}
	return nil
}

// logProbsFuser is a backend whose log-probs need not hold the logits
// (cuda.Backend on Hopper), which refuses operands it does not take with
// an error wrapping gpu.ErrNotFused. It uses the logits workspace as
// scratch and leaves no logits there.
type logProbsFuser interface {
	LogProbsFused(logp, h, w, targets gpu.Tensor, temperature float32, scratch gpu.Tensor) error
}

// headChunkFused writes the log-probs of rows [lo,hi) without entropies
// through the backend's LogProbsFused where it has one that takes the
// operands, and reports whether it did. HeadForward may take it because
// nothing reads the workspace after it: HeadBackward recomputes the
// logits, and HeadStep, whose LogitsBackward reads them, takes LogProbs.
func (c *Config) headChunkFused(b gpu.Backend, w HeadWeights, a headArgs, lo, hi int, targets, lp, logits gpu.Tensor, s Sampling) (bool, error) {
	f, ok := b.(logProbsFuser)
	if !ok {
		return false, nil
	}
	xc, err := a.xn.Rows(lo, hi)
	if err != nil {
		return false, err
	}
	tc, err := rowsOf(targets, a.n, lo, hi)
	if err != nil {
		return false, err
	}
	lc, err := rowsOf(lp, a.n, lo, hi)
	if err != nil {
		return false, err
	}
	if lc.Mem == nil {
		return false, fmt.Errorf("log-prob tensor is absent")
	}
	ws, err := logits.Rows(0, hi-lo)
	if err != nil {
		return false, err
	}
	return fusedDone(f.LogProbsFused(lc, xc, w.LMHead, tc, s.Temperature, ws))
}

// HeadBackward backpropagates dlogp (F32 [N]) and dentropy (F32 [N], or the
// zero Tensor for no entropy term) through the head. For every chunk the
// logits are recomputed into the workspace; the LM head gradient is
// accumulated into dw.LMHead and d(loss)/d(xn) written to dxn ([N,H],
// compute dtype). The norm backward then writes d(loss)/d(rows) to drows
// (fp32 [N,H]) and accumulates dw.Norm. rows, xn and rstd are those of
// HeadForward. dw.LMHead or dw.Norm may be zero Tensors to skip them. For a
// tied model dw.LMHead is the embedding's gradient.
func (c *Config) HeadBackward(b gpu.Backend, w, dw HeadWeights, rows, xn, rstd, targets, dlogp, dentropy, dxn, drows, logits gpu.Tensor, chunk int, s Sampling) error {
	a, dxn, drows, err := c.checkHeadGrads(w, rows, xn, rstd, targets, dxn, drows, logits, chunk, s)
	if err != nil {
		return fmt.Errorf("head backward: %w", err)
	}
	for lo := 0; lo < a.n; lo += a.chunk {
		hi := min(lo+a.chunk, a.n)
		if err := c.headChunk(b, w, dw, a, lo, hi, targets, dlogp, dentropy, dxn, logits, gpu.Tensor{}, s, chunkBackward); err != nil {
			return fmt.Errorf("head backward: rows [%d,%d): %w", lo, hi, err)
		}
	}
	if err := b.RMSNormBackward(drows, dw.Norm, dxn, a.rows, w.Norm, rstd); err != nil {
		return fmt.Errorf("head backward: %w", err)
	}
	return nil
}

// HeadStep is HeadForward and HeadBackward in one pass over the chunks, for
// a loss whose gradient at a token depends on that token's log-prob and
// entropy alone. After each chunk's log-probs, grad(lo, hi) must write
// dlogp and dentropy of rows [lo,hi) (it may read logp and entropy of
// those rows); the chunk's logits, still in the workspace, then become its
// gradients (LogitsBackward). It computes one logits product a chunk where
// HeadForward and HeadBackward compute two. The operands are theirs, and
// stats, unless empty, is an F32 [chunk, gpu.LogProbsStatsCols] workspace
// where each chunk's LogProbs leaves the rows' statistics for its
// LogitsBackward.
func (c *Config) HeadStep(b gpu.Backend, w, dw HeadWeights, rows, xn, rstd, targets, logp, entropy, dlogp, dentropy, dxn, drows, logits, stats gpu.Tensor, chunk int, s Sampling, grad func(lo, hi int) error) error {
	a, dxn, drows, err := c.checkHeadGrads(w, rows, xn, rstd, targets, dxn, drows, logits, chunk, s)
	if err != nil {
		return fmt.Errorf("head step: %w", err)
	}
	if err := b.RMSNorm(a.xn, rstd, a.rows, w.Norm, float32(c.RMSNormEps)); err != nil {
		return fmt.Errorf("head step: %w", err)
	}
	for lo := 0; lo < a.n; lo += a.chunk {
		hi := min(lo+a.chunk, a.n)
		if err := c.headChunk(b, w, HeadWeights{}, a, lo, hi, targets, logp, entropy, gpu.Tensor{}, logits, stats, s, chunkForward); err != nil {
			return fmt.Errorf("head step: rows [%d,%d): %w", lo, hi, err)
		}
		if err := grad(lo, hi); err != nil {
			return fmt.Errorf("head step: rows [%d,%d): %w", lo, hi, err)
		}
		if err := c.headChunk(b, w, dw, a, lo, hi, targets, dlogp, dentropy, dxn, logits, stats, s, chunkLogitsBackward); err != nil {
			return fmt.Errorf("head step: rows [%d,%d): %w", lo, hi, err)
		}
	}
	if err := b.RMSNormBackward(drows, dw.Norm, dxn, a.rows, w.Norm, rstd); err != nil {
		return fmt.Errorf("head step: %w", err)
	}
	return nil
}

// checkHeadGrads is checkHead for a backward, which also checks dxn and
// drows and returns them shaped [N,H].
func (c *Config) checkHeadGrads(w HeadWeights, rows, xn, rstd, targets, dxn, drows, logits gpu.Tensor, chunk int, s Sampling) (headArgs, gpu.Tensor, gpu.Tensor, error) {
	a, err := c.checkHead(w, rows, xn, rstd, targets, logits, chunk, s.Temperature)
	if err != nil {
		return a, dxn, drows, err
	}
	if dxn, err = shaped("dxn", dxn, a.n, c.HiddenSize); err != nil {
		return a, dxn, drows, err
	}
	if drows, err = shaped("drows", drows, a.n, c.HiddenSize); err != nil {
		return a, dxn, drows, err
	}
	if drows.DType != gpu.F32 {
		return a, dxn, drows, fmt.Errorf("drows must be f32, got %v", drows.DType)
	}
	return a, dxn, drows, nil
}

// The passes of headChunk.
const (
	chunkForward        = iota // LogProbs
	chunkBackward              // LogProbsBackward
	chunkLogitsBackward        // LogitsBackward
)

// headChunk runs pass (LogProbs, LogProbsBackward or LogitsBackward) on
// rows [lo,hi). In the forward, lp and ent are logp and entropy; in the
// backward, dlogp and dentropy, with dxn the output. stats, unless empty,
// is the row statistics' workspace of LogProbs and LogitsBackward.
func (c *Config) headChunk(b gpu.Backend, w, dw HeadWeights, a headArgs, lo, hi int, targets, lp, ent, dxn, logits, stats gpu.Tensor, s Sampling, pass int) error {
	n := a.n
	xc, err := a.xn.Rows(lo, hi)
	if err != nil {
		return err
	}
	tc, err := rowsOf(targets, n, lo, hi)
	if err != nil {
		return err
	}
	lc, err := rowsOf(lp, n, lo, hi)
	if err != nil {
		return err
	}
	if lc.Mem == nil {
		return fmt.Errorf("log-prob tensor is absent")
	}
	ec, err := rowsOf(ent, n, lo, hi)
	if err != nil {
		return err
	}
	ws, err := logits.Rows(0, hi-lo)
	if err != nil {
		return err
	}
	var sc gpu.Tensor
	if stats.Mem != nil {
		if sc, err = stats.Rows(0, hi-lo); err != nil {
			return fmt.Errorf("stats: %w", err)
		}
	}
	if pass == chunkForward {
		return b.LogProbs(lc, ec, xc, w.LMHead, tc, s.Temperature, s.EntropyTempered, ws, sc)
	}
	dc, err := dxn.Rows(lo, hi)
	if err != nil {
		return err
	}
	if pass == chunkLogitsBackward {
		return b.LogitsBackward(dc, dw.LMHead, lc, ec, xc, w.LMHead, tc, s.Temperature, s.EntropyTempered, ws, sc)
	}
	return b.LogProbsBackward(dc, dw.LMHead, lc, ec, xc, w.LMHead, tc, s.Temperature, s.EntropyTempered, ws)
}

// SelectRows copies dst[i] = src[idx[i]] (casting to dst's dtype). idx is
// I32 [N], dst [N,H] and src [T,H]. It is the embedding gather with src as
// the table.
func SelectRows(b gpu.Backend, dst, src, idx gpu.Tensor) error {
	if err := b.Embedding(dst, src, idx); err != nil {
		return fmt.Errorf("select rows: %w", err)
	}
	return nil
}

// ScatterAddRows accumulates dst[idx[i]] += src[i]. idx is I32 [N], src
// [N,H] and dst [T,H]; repeated indices add up. It is the embedding
// backward with dst as the table's gradient.
func ScatterAddRows(b gpu.Backend, dst, src, idx gpu.Tensor) error {
	if err := b.EmbeddingBackward(dst, src, idx); err != nil {
		return fmt.Errorf("scatter-add rows: %w", err)
	}
	return nil
}

// HeadLogits computes the logits of the rows[lo, hi) into logits (fp32,
// [hi−lo, V], a chunk's workspace): xn = RMSNorm(rows) into xn and rstd
// (done when lo is 0, for all rows), then logits = xn[lo:hi] · W_lmheadᵀ,
// untempered. It is the head of sampling, where the whole distribution is
// needed rather than the log-prob of a target.
func (c *Config) HeadLogits(b gpu.Backend, w HeadWeights, rows, xn, rstd, logits gpu.Tensor, lo, hi int) error {
	if lo == 0 {
		if err := b.RMSNorm(xn, rstd, rows, w.Norm, float32(c.RMSNormEps)); err != nil {
			return fmt.Errorf("head logits: %w", err)
		}
	}
	xc, err := xn.Rows(lo, hi)
	if err != nil {
		return fmt.Errorf("head logits: %w", err)
	}
	lc, err := logits.Rows(0, hi-lo)
	if err != nil {
		return fmt.Errorf("head logits: %w", err)
	}
	if err := b.Gemm(lc, xc, w.LMHead, false, true, 1, 0); err != nil {
		return fmt.Errorf("head logits: %w", err)
	}
	return nil
}
