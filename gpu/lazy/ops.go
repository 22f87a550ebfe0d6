package lazy

import (
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
)

// The ops below run on the inner backend in the view's stream order
// (Backend.do). Uploads copy their source first, as a GPU's copy from
// pageable memory does before it returns; reads run once the view's stream
// has run (Backend.now).

// Fill issues the inner backend's Fill.
func (b *Backend) Fill(dst gpu.Tensor, v float32) error {
	return b.do(func(in gpu.Backend) error { return in.Fill(dst, v) })
}

// Zero issues the inner backend's Zero.
func (b *Backend) Zero(dst gpu.Tensor) error {
	return b.do(func(in gpu.Backend) error { return in.Zero(dst) })
}

// Embedding issues the inner backend's Embedding.
func (b *Backend) Embedding(dst, table, ids gpu.Tensor) error {
	return b.do(func(in gpu.Backend) error { return in.Embedding(dst, table, ids) })
}

// CopyRows issues the inner backend's CopyRows.
func (b *Backend) CopyRows(dst, src, rows gpu.Tensor) error {
	return b.do(func(in gpu.Backend) error { return in.CopyRows(dst, src, rows) })
}

// EmbeddingBackward issues the inner backend's EmbeddingBackward.
func (b *Backend) EmbeddingBackward(dTable, dY, ids gpu.Tensor) error {
	return b.do(func(in gpu.Backend) error { return in.EmbeddingBackward(dTable, dY, ids) })
}

// RMSNorm issues the inner backend's RMSNorm.
func (b *Backend) RMSNorm(dst, rstd, x, w gpu.Tensor, eps float32) error {
	return b.do(func(in gpu.Backend) error { return in.RMSNorm(dst, rstd, x, w, eps) })
}

// RMSNormBackward issues the inner backend's RMSNormBackward.
func (b *Backend) RMSNormBackward(dx, dw, dy, x, w, rstd gpu.Tensor) error {
	return b.do(func(in gpu.Backend) error { return in.RMSNormBackward(dx, dw, dy, x, w, rstd) })
}

// AddRMSNorm issues the inner backend's AddRMSNorm.
func (b *Backend) AddRMSNorm(sum, dst, rstd, a, b2, w gpu.Tensor, eps float32) error {
	return b.do(func(in gpu.Backend) error { return in.AddRMSNorm(sum, dst, rstd, a, b2, w, eps) })
}

// RMSNormBackwardAdd issues the inner backend's RMSNormBackwardAdd.
func (b *Backend) RMSNormBackwardAdd(acc, cast, dw, dy, x, w, rstd gpu.Tensor) error {
	return b.do(func(in gpu.Backend) error { return in.RMSNormBackwardAdd(acc, cast, dw, dy, x, w, rstd) })
}

// Gemm issues the inner backend's Gemm.
func (b *Backend) Gemm(c, a, b2 gpu.Tensor, transA, transB bool, alpha, beta float32) error {
	return b.do(func(in gpu.Backend) error { return in.Gemm(c, a, b2, transA, transB, alpha, beta) })
}

// AddBias issues the inner backend's AddBias.
func (b *Backend) AddBias(y, bias gpu.Tensor) error {
	return b.do(func(in gpu.Backend) error { return in.AddBias(y, bias) })
}

// BiasGrad issues the inner backend's BiasGrad.
func (b *Backend) BiasGrad(db, dy gpu.Tensor) error {
	return b.do(func(in gpu.Backend) error { return in.BiasGrad(db, dy) })
}

// RoPE issues the inner backend's RoPE.
func (b *Backend) RoPE(x, pos gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) error {
	return b.do(func(in gpu.Backend) error { return in.RoPE(x, pos, theta, scaling) })
}

// RoPEBackward issues the inner backend's RoPEBackward.
func (b *Backend) RoPEBackward(dx, pos gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) error {
	return b.do(func(in gpu.Backend) error { return in.RoPEBackward(dx, pos, theta, scaling) })
}

// QKVSplit issues the inner backend's QKVSplit.
func (b *Backend) QKVSplit(q, k, v, qkv, bias, pos gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) error {
	return b.do(func(in gpu.Backend) error { return in.QKVSplit(q, k, v, qkv, bias, pos, theta, scaling) })
}

// QKVPack issues the inner backend's QKVPack.
func (b *Backend) QKVPack(dqkv, dq, dk, dv, pos gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) error {
	return b.do(func(in gpu.Backend) error { return in.QKVPack(dqkv, dq, dk, dv, pos, theta, scaling) })
}

// Attention issues the inner backend's Attention.
func (b *Backend) Attention(out, lse, q, k, v, cuSeqlens gpu.Tensor, scale float32) error {
	return b.do(func(in gpu.Backend) error { return in.Attention(out, lse, q, k, v, cuSeqlens, scale) })
}

// AttentionBackward issues the inner backend's AttentionBackward.
func (b *Backend) AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, cuSeqlens gpu.Tensor, scale float32) error {
	return b.do(func(in gpu.Backend) error {
		return in.AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, cuSeqlens, scale)
	})
}

// SwiGLU issues the inner backend's SwiGLU.
func (b *Backend) SwiGLU(out, gate, up gpu.Tensor) error {
	return b.do(func(in gpu.Backend) error { return in.SwiGLU(out, gate, up) })
}

// SwiGLUBackward issues the inner backend's SwiGLUBackward.
func (b *Backend) SwiGLUBackward(dGate, dUp, dOut, gate, up gpu.Tensor) error {
	return b.do(func(in gpu.Backend) error { return in.SwiGLUBackward(dGate, dUp, dOut, gate, up) })
}

// Add issues the inner backend's Add.
func (b *Backend) Add(dst, a, b2 gpu.Tensor) error {
	return b.do(func(in gpu.Backend) error { return in.Add(dst, a, b2) })
}

// Scale issues the inner backend's Scale.
func (b *Backend) Scale(x gpu.Tensor, s float32) error {
	return b.do(func(in gpu.Backend) error { return in.Scale(x, s) })
}

// AddScaled issues the inner backend's AddScaled.
func (b *Backend) AddScaled(dst, x gpu.Tensor, s float32) error {
	return b.do(func(in gpu.Backend) error { return in.AddScaled(dst, x, s) })
}

// LogProbs issues the inner backend's LogProbs.
func (b *Backend) LogProbs(logp, entropy, h, w, targets gpu.Tensor, temperature float32, entropyTempered bool, logits, stats gpu.Tensor) error {
	return b.do(func(in gpu.Backend) error {
		return in.LogProbs(logp, entropy, h, w, targets, temperature, entropyTempered, logits, stats)
	})
}

// LogProbsBackward issues the inner backend's LogProbsBackward.
func (b *Backend) LogProbsBackward(dh, dw, dlogp, dentropy, h, w, targets gpu.Tensor, temperature float32, entropyTempered bool, logits gpu.Tensor) error {
	return b.do(func(in gpu.Backend) error {
		return in.LogProbsBackward(dh, dw, dlogp, dentropy, h, w, targets, temperature, entropyTempered, logits)
	})
}

// LogitsBackward issues the inner backend's LogitsBackward.
func (b *Backend) LogitsBackward(dh, dw, dlogp, dentropy, h, w, targets gpu.Tensor, temperature float32, entropyTempered bool, logits, stats gpu.Tensor) error {
	return b.do(func(in gpu.Backend) error {
		return in.LogitsBackward(dh, dw, dlogp, dentropy, h, w, targets, temperature, entropyTempered, logits, stats)
	})
}

// AdamW issues the inner backend's AdamW.
func (b *Backend) AdamW(p, g, m, v gpu.Tensor, s gpu.AdamWStep) error {
	return b.do(func(in gpu.Backend) error { return in.AdamW(p, g, m, v, s) })
}

// SumSquaresTo issues the inner backend's SumSquaresTo.
func (b *Backend) SumSquaresTo(dst, x gpu.Tensor) error {
	return b.do(func(in gpu.Backend) error { return in.SumSquaresTo(dst, x) })
}

// Upload issues the inner backend's Upload of a copy of src.
func (b *Backend) Upload(dst gpu.Tensor, src []float32) error {
	c := append([]float32(nil), src...)
	return b.do(func(in gpu.Backend) error { return in.Upload(dst, c) })
}

// UploadI32 issues the inner backend's UploadI32 of a copy of src.
func (b *Backend) UploadI32(dst gpu.Tensor, src []int32) error {
	c := append([]int32(nil), src...)
	return b.do(func(in gpu.Backend) error { return in.UploadI32(dst, c) })
}

// UploadBytes issues the inner backend's UploadBytes of a copy of src.
func (b *Backend) UploadBytes(dst gpu.Tensor, src []byte) error {
	c := append([]byte(nil), src...)
	return b.do(func(in gpu.Backend) error { return in.UploadBytes(dst, c) })
}

// Download reads src once the view's stream has run.
func (b *Backend) Download(dst []float32, src gpu.Tensor) error {
	return b.now(func(in gpu.Backend) error { return in.Download(dst, src) })
}

// DownloadI32 reads src once the view's stream has run.
func (b *Backend) DownloadI32(dst []int32, src gpu.Tensor) error {
	return b.now(func(in gpu.Backend) error { return in.DownloadI32(dst, src) })
}

// DownloadBytes reads src once the view's stream has run.
func (b *Backend) DownloadBytes(dst []byte, src gpu.Tensor) error {
	return b.now(func(in gpu.Backend) error { return in.DownloadBytes(dst, src) })
}

// SumSquares returns Σ src² once the view's stream has run.
func (b *Backend) SumSquares(x gpu.Tensor) (float64, error) {
	var v float64
	err := b.now(func(in gpu.Backend) error {
		var err error
		v, err = in.SumSquares(x)
		return err
	})
	return v, err
}

// Copy issues the inner backend's Copy. A copy from or to memory another
// backend allocated is synchronous, as the CUDA backend's is: it runs once
// the view's stream has run.
func (b *Backend) Copy(dst, src gpu.Tensor) error {
	if !b.ownTensor(dst) || !b.ownTensor(src) {
		return b.now(func(in gpu.Backend) error { return in.Copy(dst, src) })
	}
	return b.do(func(in gpu.Backend) error { return in.Copy(dst, src) })
}

// spanner is what ring attention needs of a backend beyond gpu.Backend
// (model.RingBackend): the wrapper has it when its inner backend does.
type spanner interface {
	AttentionSpans(out, lse, q, k, v gpu.Tensor, spans []gpu.Span, scale float32) error
	AttentionSpansBackward(dq, dk, dv, dout, out, lse, q, k, v gpu.Tensor, spans []gpu.Span, scale float32) error
	MergeAttention(out, lse, bout, blse gpu.Tensor) error
}

// ring returns the inner backend's span attention, or an error.
func ring(in gpu.Backend) (spanner, error) {
	r, ok := in.(spanner)
	if !ok {
		return nil, fmt.Errorf("lazy: backend %s has no span attention", in.Name())
	}
	return r, nil
}

// AttentionSpans issues the inner backend's AttentionSpans.
func (b *Backend) AttentionSpans(out, lse, q, k, v gpu.Tensor, spans []gpu.Span, scale float32) error {
	sp := append([]gpu.Span(nil), spans...)
	return b.do(func(in gpu.Backend) error {
		r, err := ring(in)
		if err != nil {
			return err
		}
		return r.AttentionSpans(out, lse, q, k, v, sp, scale)
	})
}

// AttentionSpansBackward issues the inner backend's AttentionSpansBackward.
func (b *Backend) AttentionSpansBackward(dq, dk, dv, dout, out, lse, q, k, v gpu.Tensor, spans []gpu.Span, scale float32) error {
	sp := append([]gpu.Span(nil), spans...)
	return b.do(func(in gpu.Backend) error {
		r, err := ring(in)
		if err != nil {
			return err
		}
		return r.AttentionSpansBackward(dq, dk, dv, dout, out, lse, q, k, v, sp, scale)
	})
}

// MergeAttention issues the inner backend's MergeAttention.
func (b *Backend) MergeAttention(out, lse, bout, blse gpu.Tensor) error {
	return b.do(func(in gpu.Backend) error {
		r, err := ring(in)
		if err != nil {
			return err
		}
		return r.MergeAttention(out, lse, bout, blse)
	})
}
