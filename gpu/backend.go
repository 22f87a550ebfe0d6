// Package gpu defines the compute backend that the decoder math is written
// against: memory, tensors (views at offsets into a planned arena), streams,
// transfers and the transformer ops, with dtype helpers and GPU memory
// presets. Implementations live in sub-packages (gpu/cpu is the pure-Go
// reference).
//
// Ops never allocate device memory: every output and workspace is a Tensor
// passed in by the caller, so the memory plan is the whole allocation. All
// shapes are checked and mismatches are returned as errors. Ops run in issue
// order on the backend's current stream (see Backend.On); on the CPU backend
// they complete before returning.
package gpu

import (
	"fmt"
	"math"
)

// Stream is an ordered queue of device work. On the CPU backend every
// operation completes before it returns and streams are no-ops.
type Stream interface {
	// Sync blocks until all work issued on the stream has completed.
	Sync() error
	// Record returns an event that completes when the work issued on the
	// stream so far has completed.
	Record() (Event, error)
	// Wait makes work issued on the stream after this call wait for e.
	Wait(e Event) error
	// Close releases the stream.
	Close() error
}

// Event marks a point in a stream.
type Event interface {
	// Sync blocks until the event has completed.
	Sync() error
	// Close releases the event.
	Close() error
}

// RoPEScaling is the rope_scaling (transformers 4) or rope_parameters
// (transformers 5) block of a config. A nil *RoPEScaling, Type "" and Type
// "default" all mean unscaled rotary embeddings.
type RoPEScaling struct {
	// Type is the rope_type: "default", "linear" or "llama3".
	Type string
	// Factor divides the frequencies ("linear") or the low frequencies
	// ("llama3").
	Factor float64
	// LowFreqFactor and HighFreqFactor bound the smoothly interpolated band
	// ("llama3").
	LowFreqFactor, HighFreqFactor float64
	// OriginalMaxPositionEmbeddings is the pre-training context length
	// ("llama3").
	OriginalMaxPositionEmbeddings int
}

// Backend is a compute device. Tensors passed to its methods must live in
// Memory that the backend (or a compatible one, such as its pinned host
// memory) allocated. Unless stated otherwise, floating-point operands may be
// F32, BF16 or F16 independently: values are read as float32, computed in
// float32 (or float64 for reductions) and written back with
// round-to-nearest-even. "(accumulate)" means the op adds into the output;
// otherwise outputs are overwritten. In-place use (an output that is also an
// input) is allowed only where documented.
type Backend interface {
	// Name identifies the backend ("cpu", "cuda:0", ...).
	Name() string

	// Alloc allocates device memory; it is meant to be called once per
	// device for the arena that the memory plan divides. Contents are zero
	// on the CPU backend and undefined elsewhere.
	Alloc(bytes int64) (Memory, error)
	// AllocHost allocates pinned host memory (HostMemory), e.g. for offloaded
	// parameters and optimizer state.
	AllocHost(bytes int64) (Memory, error)
	// Free releases memory from Alloc or AllocHost.
	Free(m Memory) error

	// NewStream creates a stream (for overlapping copies with compute).
	NewStream() (Stream, error)
	// DefaultStream returns the stream ops run on when no other is chosen.
	DefaultStream() Stream
	// On returns a view of the backend whose operations are issued on s.
	On(s Stream) Backend
	// Sync blocks until all work on all streams of the device has completed.
	Sync() error

	// Upload converts src to dst's dtype and writes it; len(src) must equal
	// dst.Numel().
	Upload(dst Tensor, src []float32) error
	// UploadI32 writes src into an I32 tensor; len(src) must equal Numel.
	UploadI32(dst Tensor, src []int32) error
	// UploadBytes writes raw little-endian bytes; len(src) == dst.Bytes().
	UploadBytes(dst Tensor, src []byte) error
	// Download converts src to float32 into dst; len(dst) == src.Numel().
	Download(dst []float32, src Tensor) error
	// DownloadI32 reads an I32 tensor; len(dst) == src.Numel().
	DownloadI32(dst []int32, src Tensor) error
	// DownloadBytes reads raw bytes; len(dst) == src.Bytes().
	DownloadBytes(dst []byte, src Tensor) error
	// Copy copies src into dst (same element count, shapes may differ),
	// casting between dtypes; the tensors may be in different memories
	// (device and pinned host). Overlapping src and dst must be identical.
	Copy(dst, src Tensor) error
	// Fill sets every element of dst to v (rounded to dst's dtype).
	Fill(dst Tensor, v float32) error
	// Zero sets every byte of dst to zero.
	Zero(dst Tensor) error

	// Embedding gathers rows: dst[t] = table[ids[t]]. dst [T,H], table
	// [V,H], ids I32 [T]; an id outside [0,V) is an error.
	Embedding(dst, table, ids Tensor) error
	// EmbeddingBackward scatters (accumulate): dTable[ids[t]] += dY[t].
	EmbeddingBackward(dTable, dY, ids Tensor) error
	// CopyRows copies the listed rows: dst[rows[j]] = src[rows[j]]. dst
	// and src [V,H] of one dtype, either of them in pinned host memory;
	// rows I32 [R] in [0,V) (a repeated row is copied again).
	CopyRows(dst, src, rows Tensor) error

	// RMSNorm computes, row by row over x [T,H], rstd = 1/sqrt(mean(x²)+eps)
	// (saved to rstd, F32 [T]) and dst = w * round_x(x*rstd), i.e. HF Llama
	// and Qwen2 RMSNorm: the normalised row is cast to x's dtype before the
	// weight w [H] multiplies it. Used for Qwen3 q/k norm with x viewed as
	// [T*heads, D]. dst may be x.
	RMSNorm(dst, rstd, x, w Tensor, eps float32) error
	// RMSNormBackward computes dx (write) and dw (accumulate; may be empty
	// to skip) from dy, x, w and the rstd saved by RMSNorm. dx may be dy.
	RMSNormBackward(dx, dw, dy, x, w, rstd Tensor) error
	// AddRMSNorm writes sum = a + b and then RMSNorm(dst, rstd, sum, w,
	// eps): the residual add before a norm in one pass where the backend
	// has a kernel for it, with the values of the two steps
	// (AddRMSNormSteps). sum may be a or b.
	AddRMSNorm(sum, dst, rstd, a, b, w Tensor, eps float32) error
	// RMSNormBackwardAdd is RMSNormBackward whose dx, in dy's dtype, is
	// added into acc instead of written, followed, when cast is present
	// (Mem not nil), by cast = acc in cast's dtype: the norm backward, the
	// residual gradient's update and the next op's cast of it in one pass
	// where the backend has a kernel for it, with the values of those
	// steps (RMSNormBackwardAddSteps). dy is clobbered.
	RMSNormBackwardAdd(acc, cast, dw, dy, x, w, rstd Tensor) error

	// Gemm computes c = alpha*op(a)@op(b) + beta*c with float32
	// accumulation, where op(a) is a or aᵀ (transA) and op(b) likewise; all
	// three are 2-D, op(a) [M,K], op(b) [K,N], c [M,N]. With beta == 0, c is
	// not read. c must not overlap a or b. A linear layer y = x@Wᵀ is
	// Gemm(y, x, W, false, true, 1, 0).
	Gemm(c, a, b Tensor, transA, transB bool, alpha, beta float32) error
	// AddBias adds b [N] to every row of y [T,N] (in place).
	AddBias(y, b Tensor) error
	// BiasGrad accumulates the column sums of dy [T,N] into db [N].
	BiasGrad(db, dy Tensor) error

	// RoPE rotates x [T,heads,D] in place by position pos (I32 [T]) with
	// the HF rotate-half convention (element i pairs with i+D/2), matching
	// HF apply_rotary_pos_emb including its roundings: cos and sin are cast
	// to x's dtype, and x*cos, rotate_half(x)*sin and their sum are each
	// rounded to it. Frequencies are RoPEInvFreq(D, theta, scaling).
	RoPE(x, pos Tensor, theta float64, scaling *RoPEScaling) error
	// RoPEBackward turns dy [T,heads,D] into dx in place: the rotation by the
	// negative angle (the transpose of RoPE).
	RoPEBackward(dx, pos Tensor, theta float64, scaling *RoPEScaling) error

	// QKVSplit takes the output of the fused q/k/v projection, qkv
	// [T, (Hq+2·Hkv)·D] (each row q's Hq·D columns, then k's Hkv·D, then
	// v's), adds bias [(Hq+2·Hkv)·D] when it is present (Mem not nil),
	// writes q [T,Hq,D], k and v [T,Hkv,D], and rotates q and k by RoPE:
	// the values of the steps QKVSplitSteps gives (the columns copied,
	// AddBias, RoPE), in one pass where the backend has a kernel for it.
	QKVSplit(q, k, v, qkv, bias, pos Tensor, theta float64, scaling *RoPEScaling) error
	// QKVPack is the backward of QKVSplit's copy and rotation: it writes
	// dqkv [T, (Hq+2·Hkv)·D] from dq [T,Hq,D] and dk rotated back
	// (RoPEBackward) and from dv: the values of QKVPackSteps. dq and dk
	// are clobbered.
	QKVPack(dqkv, dq, dk, dv, pos Tensor, theta float64, scaling *RoPEScaling) error

	// Attention is causal scaled-dot-product attention over packed
	// variable-length sequences: q [T,Hq,D], k and v [T,Hkv,D], out
	// [T,Hq,D], lse F32 [Hq,T] (saved log-sum-exp of the scaled scores, for
	// the backward), cuSeqlens I32 [S+1] with cuSeqlens[0] == 0,
	// non-decreasing, cuSeqlens[S] == T. A token attends to the tokens of
	// its own sequence at or before it. Query head h uses kv head
	// h/(Hq/Hkv) (grouped-query attention; Hq must be a multiple of Hkv).
	// scale multiplies q·k (usually 1/sqrt(D)). No [T,T] matrix is formed.
	Attention(out, lse, q, k, v, cuSeqlens Tensor, scale float32) error
	// AttentionBackward computes dq [T,Hq,D], dk and dv [T,Hkv,D] (write;
	// dk and dv are summed over the query heads sharing a kv head) from
	// dout, and out and lse saved by Attention.
	AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, cuSeqlens Tensor, scale float32) error

	// SwiGLU computes out = silu(gate)*up elementwise (HF rounding: silu is
	// rounded to gate's dtype before the product). All shapes equal; out may
	// be gate or up.
	SwiGLU(out, gate, up Tensor) error
	// SwiGLUBackward computes dGate and dUp (write) from dOut, gate and up.
	// All shapes equal; dGate may be dOut, dGate must not be gate or up.
	SwiGLUBackward(dGate, dUp, dOut, gate, up Tensor) error

	// Add computes dst = a + b elementwise (shapes equal; dst may be a or b).
	Add(dst, a, b Tensor) error
	// Scale computes x *= s in place.
	Scale(x Tensor, s float32) error
	// AddScaled computes dst += s*x (shapes equal).
	AddScaled(dst, x Tensor, s float32) error

	// LogProbs computes, for a chunk of C tokens, logits = h@wᵀ (h [C,H], w
	// [V,H], float32 accumulation) into the F32 workspace logits [C,V], then
	// logp[c] = log_softmax(logits[c]/temperature)[targets[c]] (logp F32
	// [C], targets I32 [C] in [0,V)) and, unless entropy is empty, entropy[c]
	// = −Σ p log p of softmax(logits[c]) (of logits[c]/temperature when
	// entropyTempered). temperature must be positive. Unless stats is
	// empty, it is an F32 [C, LogProbsStatsCols] workspace where LogProbs
	// leaves the rows' softmax statistics for LogitsBackward (their layout
	// is the backend's).
	LogProbs(logp, entropy, h, w, targets Tensor, temperature float32, entropyTempered bool, logits, stats Tensor) error
	// LogProbsBackward recomputes the logits into the workspace, turns them
	// into dlogits in place, and computes dh = dlogits@w (write, [C,H]) and
	// dw += dlogitsᵀ@h (accumulate, [V,H]) from dlogp F32 [C] and dentropy
	// F32 [C] (may be empty: no entropy term). dw may be empty to skip it.
	LogProbsBackward(dh, dw, dlogp, dentropy, h, w, targets Tensor, temperature float32, entropyTempered bool, logits Tensor) error
	// LogitsBackward is LogProbsBackward for a chunk whose logits LogProbs
	// has just written into the workspace, for the same h, w and
	// temperature: it turns them into dlogits without recomputing them.
	// Unless stats is empty, it is the workspace where that LogProbs left
	// the rows' statistics: the backward takes them from there instead of
	// reading the logits a second time (a backend may recompute them; the
	// results agree to the statistics' rounding).
	LogitsBackward(dh, dw, dlogp, dentropy, h, w, targets Tensor, temperature float32, entropyTempered bool, logits, stats Tensor) error

	// AdamW performs one torch.optim.AdamW step (decoupled weight decay,
	// bias correction, eps added after the square root) on tensors of
	// equal shape, p, m and v F32 and g F32, BF16 or F16 (a 16-bit grad is
	// read as its exact float32 value): p -= lr*wd*p; m = lerp(m, g, 1-beta1); v = beta2*v +
	// (1-beta2)*g²; p -= lr/(1-beta1^step) * m / (sqrt(v)/sqrt(1-beta2^step)
	// + eps). The hyper-parameters are float64 like the Python floats torch
	// receives; scalar factors are formed in float64 and applied in float32,
	// in torch's operation order. g is read multiplied by s.GradScale (in
	// float32, as clip_grad_norm_ scales the grads in place) and is not
	// modified.
	AdamW(p, g, m, v Tensor, s AdamWStep) error
	// SumSquares returns Σ x² (accumulated in float64), for the global
	// gradient norm; the caller all-reduces it across ranks.
	SumSquares(x Tensor) (float64, error)
	// SumSquaresTo writes Σ x², the same float64 SumSquares returns, into
	// dst, a tensor of 8 bytes, little-endian, in stream order and without
	// waiting for the device (read it with DownloadBytes).
	SumSquaresTo(dst, x Tensor) error
}

// AdamWStep holds the scalars of one AdamW step.
type AdamWStep struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
	// Step counts from 1 (bias correction).
	Step int
	// GradScale multiplies every gradient before the update: the grad-norm
	// clipping coefficient. Zero means 1.
	GradScale float32
}

// Check validates the step's scalars; op labels the error.
func (s AdamWStep) Check(op string) error {
	if s.Step < 1 {
		return fmt.Errorf("%s: step %d must be at least 1", op, s.Step)
	}
	if !(s.Beta1 >= 0 && s.Beta1 < 1) || !(s.Beta2 >= 0 && s.Beta2 < 1) {
		return fmt.Errorf("%s: betas (%v, %v) must be in [0,1)", op, s.Beta1, s.Beta2)
	}
	if !(s.LR >= 0) || !(s.Eps >= 0) || !(s.WeightDecay >= 0) {
		return fmt.Errorf("%s: lr %v, eps %v and weight decay %v must be non-negative", op, s.LR, s.Eps, s.WeightDecay)
	}
	if !(s.GradScale >= 0) || math.IsInf(float64(s.GradScale), 0) {
		return fmt.Errorf("%s: grad scale %v must be finite and non-negative", op, s.GradScale)
	}
	return nil
}

// Scale returns the gradient multiplier: GradScale, or 1 when it is zero.
func (s AdamWStep) Scale() float32 {
	if s.GradScale == 0 {
		return 1
	}
	return s.GradScale
}
