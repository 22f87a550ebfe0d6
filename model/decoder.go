package model

import (
	"errors"
	"fmt"
	"math"

	"github.com/rlpipe/rlpipe/gpu"
)

// LayerActs holds one decoder layer's activations, named as in the forward
// table of docs/memory.md, in the layer's compute dtype (bf16 or fp32)
// unless noted. Every tensor has T rows (T = Batch.T) and may have any shape
// with the right number of elements: the ops view it as they need.
// QRaw, KRaw, RstdQ and RstdK are used only with q/k norm (Qwen3) and are
// zero Tensors otherwise.
type LayerActs struct {
	// Xn is the input norm's output [T,H]; Rstd1 its saved rstd, F32 [T].
	Xn, Rstd1 gpu.Tensor
	// QRaw and KRaw are the q and k projections before q/k norm,
	// [T,Hq·D] and [T,Hkv·D]; RstdQ and RstdK their per-head rstd, F32
	// [T·Hq] and [T·Hkv].
	QRaw, KRaw, RstdQ, RstdK gpu.Tensor
	// Q, K and V are the attention inputs (q and k after RoPE), [T,Hq,D],
	// [T,Hkv,D], [T,Hkv,D].
	Q, K, V gpu.Tensor
	// Attn is the attention output [T,Hq,D]; LSE its log-sum-exp, F32
	// [Hq,T].
	Attn, LSE gpu.Tensor
	// Mid is the fp32 residual after attention, in + o_proj(attn), [T,H].
	Mid gpu.Tensor
	// Xn2 is the post-attention norm's output [T,H]; Rstd2 its rstd, F32
	// [T].
	Xn2, Rstd2 gpu.Tensor
	// Gate, Up and Act are the MLP activations [T,I]: act = silu(gate)·up.
	Gate, Up, Act gpu.Tensor
	// OOut and DownOut are the o_proj and down_proj outputs [T,H], forward
	// scratch that the backward does not read.
	OOut, DownOut gpu.Tensor
	// Lean, for LayerBackward, says that the forward did not keep the
	// element-wise activations Xn, Xn2 and Act (they were its scratch):
	// the backward recomputes each from what it kept (the layer input and
	// Rstd1, Mid and Rstd2, Gate and Up) just before its one use, into
	// the gradient temporary that is written only after that use (Dxn,
	// Dxn2, Dgate). The recomputation runs the forward's kernels on the
	// same inputs, so the results are the same bits as with everything
	// kept; it costs one RMSNorm twice and one SwiGLU per layer and frees
	// 2·[T,H] + [T,I] of saved activations.
	Lean bool
	// Transient says that no backward follows the forward (the
	// reference's log-probs): on a backend with the gate/up product and
	// SwiGLU as one op (cuda.Backend.GateUpSwiGLU) it then writes Act
	// alone, stores neither product, and leaves Gate and Up as they were
	// unless Act is one of them. Act may be Gate's view (the stages plan
	// it so): the unfused path's SwiGLU then runs in place. A forward that
	// a backward follows takes the same kernel through
	// cuda.Backend.GateUpSwiGLUKeep, which also stores Gate and Up (Act
	// then SwiGLU's bits of them, as a Lean backward recomputes it); every
	// forward of a layer, a backward's rerun too, takes the same op, so
	// the rerun gives the forward's bits.
	Transient bool
	// QKV, when present, is forward scratch [T, Hq·D+2·Hkv·D] for the
	// q, k and v projections as one matrix product, which
	// gpu.Backend.QKVSplit then splits (adding the biases and applying
	// RoPE). The weights must be adjacent (Config.FusedQKV); Qwen3's
	// q/k norms do not take this path. A backend with QKVRoPE (qkvRoPEr)
	// writes q, k and v from the product's registers and uses QKV as
	// scratch for its cos and sin; every forward of a layer, a backward's rerun too, takes the
	// same op, so the rerun gives the forward's bits.
	QKV gpu.Tensor
}

// LayerGradBufs holds the gradient temporaries of a decoder layer backward,
// in the compute dtype, each with T rows: Dy, DyO, Dxn2 and Dxn [T,H];
// Dgate and Dup [T,I]; Dattn and Dq [T,Hq·D]; Dk and Dv [T,Hkv·D]. The
// gradient of SwiGLU's output (dy·W_down) has no buffer of its own: it is
// formed in Dgate and SwiGLU's backward runs in place there, or a backend
// with both as one op (downSwiGLUBackwarder) never stores it.
//
// Dqkv [T, Hq·D+2·Hkv·D], when present, takes the fused backward of the
// q, k and v projections (see LayerActs.QKV): dq, dk rotated back and dv
// packed into it (gpu.Backend.QKVPack), then one product for the weight
// gradients and one for dxn.
type LayerGradBufs struct {
	Dy, Dgate, Dup, Dxn2, DyO, Dattn, Dq, Dk, Dv, Dxn, Dqkv gpu.Tensor
}

// Batch describes a packed micro-batch: Positions (I32 [T], restarting at 0
// for every sequence), CuSeqlens (I32 [S+1], the sequence boundaries) and
// the token count T.
type Batch struct {
	Positions, CuSeqlens gpu.Tensor
	T                    int
	// Hook, when set, is called with the name of each op before the op
	// runs: "norm1", "qkv", "attention", "o_proj", "norm2", "gate_up",
	// "swiglu", "down" in LayerForward, and "down backward", "swiglu
	// backward", "gate_up backward", "norm2 backward", "o_proj backward",
	// "attention backward", "qkv backward", "norm1 backward" in
	// LayerBackward. The executor uses it to follow the memory plan's op
	// sequence; an error stops the layer.
	Hook func(op string) error
	// Attend, when set, takes the place of causal attention over
	// CuSeqlens, and AttendBackward of its backward: context parallelism's
	// ring attention, whose rows are one rank's part of longer sequences
	// (Positions then hold their positions in the sequence). q [T,Hq,D],
	// k and v [T,Hkv,D], out [T,Hq,D], lse F32 [Hq,T], as for
	// gpu.Backend.Attention.
	Attend         func(out, lse, q, k, v gpu.Tensor, scale float32) error
	AttendBackward func(dq, dk, dv, dout, out, lse, q, k, v gpu.Tensor, scale float32) error
}

// attention runs the batch's attention: Attend when set, else causal
// attention over CuSeqlens.
func (batch Batch) attention(b gpu.Backend, out, lse, q, k, v gpu.Tensor, scale float32) error {
	if batch.Attend != nil {
		return batch.Attend(out, lse, q, k, v, scale)
	}
	return b.Attention(out, lse, q, k, v, batch.CuSeqlens, scale)
}

// attentionBackward is the backward of attention.
func (batch Batch) attentionBackward(b gpu.Backend, dq, dk, dv, dout, out, lse, q, k, v gpu.Tensor, scale float32) error {
	if batch.AttendBackward != nil {
		return batch.AttendBackward(dq, dk, dv, dout, out, lse, q, k, v, scale)
	}
	return b.AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, batch.CuSeqlens, scale)
}

// enter reports op to the batch's hook.
func (batch Batch) enter(op string) error {
	if batch.Hook == nil {
		return nil
	}
	return batch.Hook(op)
}

// RoPEScaling returns the config's rotary scaling in the backend's form, or
// nil for default rotary embeddings.
func (c *Config) RoPEScaling() *gpu.RoPEScaling {
	rs := c.RopeScaling
	if rs == nil {
		return nil
	}
	return &gpu.RoPEScaling{
		Type:                          rs.Type,
		Factor:                        rs.Factor,
		LowFreqFactor:                 rs.LowFreqFactor,
		HighFreqFactor:                rs.HighFreqFactor,
		OriginalMaxPositionEmbeddings: rs.OriginalMaxPositionEmbeddings,
	}
}

// AttentionScale returns the softmax scale of the attention scores,
// 1/sqrt(head_dim), as HF computes it.
func (c *Config) AttentionScale() float32 {
	return float32(math.Pow(float64(c.HeadDim), -0.5))
}

// dims are the layer dimensions of a config.
type dims struct {
	t, h, inter, hq, hkv, d int
}

func (c *Config) dims(t int) dims {
	return dims{t: t, h: c.HiddenSize, inter: c.IntermediateSize, hq: c.NumHeads, hkv: c.NumKVHeads, d: c.HeadDim}
}

// shaped returns t viewed with shape, checking that it is present and has
// the right number of elements; name labels errors.
func shaped(name string, t gpu.Tensor, shape ...int) (gpu.Tensor, error) {
	if t.Mem == nil {
		return gpu.Tensor{}, fmt.Errorf("%s is absent", name)
	}
	n := 1
	for _, d := range shape {
		n *= d
	}
	if t.Numel() != n {
		return gpu.Tensor{}, fmt.Errorf("%s %v has %d elements, want %v", name, t.Shape, t.Numel(), shape)
	}
	return t.Reshape(shape...)
}

// layerViews are a layer's activations viewed with the shapes the ops need.
type layerViews struct {
	xn, rstd1, qraw, kraw, rstdQ, rstdK, q, k, v, q2, k2, v2, attn, attn2, lse gpu.Tensor
	mid, xn2, rstd2, gate, up, act, oOut, downOut, qkv                         gpu.Tensor
}

// viewActs checks and reshapes a's tensors. With withDown false, DownOut
// is not needed.
func (c *Config) viewActs(a *LayerActs, dm dims, withDown, lean bool) (layerViews, error) {
	var lv layerViews
	if a == nil {
		return lv, fmt.Errorf("layer activations are nil")
	}
	t, qd, kd := dm.t, dm.hq*dm.d, dm.hkv*dm.d
	type req struct {
		name  string
		dst   *gpu.Tensor
		src   gpu.Tensor
		shape []int
	}
	reqs := []req{
		{"rstd1", &lv.rstd1, a.Rstd1, []int{t}},
		{"q", &lv.q, a.Q, []int{t, dm.hq, dm.d}},
		{"k", &lv.k, a.K, []int{t, dm.hkv, dm.d}},
		{"v", &lv.v, a.V, []int{t, dm.hkv, dm.d}},
		{"q", &lv.q2, a.Q, []int{t, qd}},
		{"k", &lv.k2, a.K, []int{t, kd}},
		{"v", &lv.v2, a.V, []int{t, kd}},
		{"attn", &lv.attn, a.Attn, []int{t, dm.hq, dm.d}},
		{"attn", &lv.attn2, a.Attn, []int{t, qd}},
		{"lse", &lv.lse, a.LSE, []int{dm.hq, t}},
		{"mid", &lv.mid, a.Mid, []int{t, dm.h}},
		{"rstd2", &lv.rstd2, a.Rstd2, []int{t}},
		{"gate", &lv.gate, a.Gate, []int{t, dm.inter}},
		{"up", &lv.up, a.Up, []int{t, dm.inter}},
		{"o_out", &lv.oOut, a.OOut, []int{t, dm.h}},
	}
	if !lean {
		reqs = append(reqs,
			req{"xn", &lv.xn, a.Xn, []int{t, dm.h}},
			req{"xn2", &lv.xn2, a.Xn2, []int{t, dm.h}},
			req{"act", &lv.act, a.Act, []int{t, dm.inter}})
	}
	if withDown {
		reqs = append(reqs, req{"down_out", &lv.downOut, a.DownOut, []int{t, dm.h}})
	}
	if a.QKV.Mem != nil {
		if c.QKNorm {
			return lv, errFusedQKNorm
		}
		reqs = append(reqs, req{"qkv", &lv.qkv, a.QKV, []int{t, qd + 2*kd}})
	}
	if c.QKNorm {
		reqs = append(reqs,
			req{"q_raw", &lv.qraw, a.QRaw, []int{t * dm.hq, dm.d}},
			req{"k_raw", &lv.kraw, a.KRaw, []int{t * dm.hkv, dm.d}},
			req{"rstd_q", &lv.rstdQ, a.RstdQ, []int{t * dm.hq}},
			req{"rstd_k", &lv.rstdK, a.RstdK, []int{t * dm.hkv}},
		)
	}
	for _, r := range reqs {
		v, err := shaped(r.name, r.src, r.shape...)
		if err != nil {
			return lv, err
		}
		*r.dst = v
	}
	if lv.mid.DType != gpu.F32 {
		return lv, fmt.Errorf("mid must be f32, got %v", lv.mid.DType)
	}
	return lv, nil
}

// checkWeights checks that w holds every parameter the config needs, with
// its shape.
func (c *Config) checkWeights(what string, w LayerWeights) error {
	h, inter, qd, kd, d := c.HiddenSize, c.IntermediateSize, c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim, c.HeadDim
	type req struct {
		name  string
		t     gpu.Tensor
		shape []int
		want  bool
	}
	reqs := []req{
		{"input_layernorm", w.InputNorm, []int{h}, true},
		{"post_attention_layernorm", w.PostNorm, []int{h}, true},
		{"q_proj", w.Q, []int{qd, h}, true},
		{"k_proj", w.K, []int{kd, h}, true},
		{"v_proj", w.V, []int{kd, h}, true},
		{"o_proj", w.O, []int{h, qd}, true},
		{"q_proj bias", w.QBias, []int{qd}, c.AttentionBias},
		{"k_proj bias", w.KBias, []int{kd}, c.AttentionBias},
		{"v_proj bias", w.VBias, []int{kd}, c.AttentionBias},
		{"o_proj bias", w.OBias, []int{h}, c.OutputBias},
		{"q_norm", w.QNorm, []int{d}, c.QKNorm},
		{"k_norm", w.KNorm, []int{d}, c.QKNorm},
		{"gate_proj", w.Gate, []int{inter, h}, true},
		{"up_proj", w.Up, []int{inter, h}, true},
		{"down_proj", w.Down, []int{h, inter}, true},
	}
	for _, r := range reqs {
		if !r.want {
			continue
		}
		if r.t.Mem == nil {
			return fmt.Errorf("%s %s is absent", what, r.name)
		}
		if !gpu.SameShape(r.t.Shape, r.shape) {
			return fmt.Errorf("%s %s has shape %v, want %v", what, r.name, r.t.Shape, r.shape)
		}
	}
	return nil
}

// checkBatch checks the batch and, for a sliding-window model, that no
// sequence is longer than the window (the backend's attention is full
// causal, which equals sliding-window attention on such sequences).
func (c *Config) checkBatch(b gpu.Backend, batch Batch) error {
	if batch.T <= 0 {
		return fmt.Errorf("batch has %d tokens", batch.T)
	}
	if batch.Positions.DType != gpu.I32 || batch.Positions.Numel() != batch.T || batch.Positions.Mem == nil {
		return fmt.Errorf("batch positions must be i32 [%d], got %v", batch.T, batch.Positions)
	}
	if batch.CuSeqlens.DType != gpu.I32 || batch.CuSeqlens.Numel() < 2 || batch.CuSeqlens.Mem == nil {
		return fmt.Errorf("batch cu_seqlens must be i32 [S+1] with S >= 1, got %v", batch.CuSeqlens)
	}
	if c.SlidingWindow > 0 && batch.T > c.SlidingWindow {
		cu := make([]int32, batch.CuSeqlens.Numel())
		if err := b.DownloadI32(cu, batch.CuSeqlens); err != nil {
			return fmt.Errorf("read cu_seqlens: %w", err)
		}
		for i := 1; i < len(cu); i++ {
			if n := int(cu[i]) - int(cu[i-1]); n > c.SlidingWindow {
				return fmt.Errorf("sequence %d has %d tokens, more than sliding_window %d: %w", i-1, n, c.SlidingWindow, ErrUnsupported)
			}
		}
	}
	return nil
}

func flat2(name string, t gpu.Tensor, rows, cols int) (gpu.Tensor, error) {
	return shaped(name, t, rows, cols)
}

// LayerForward runs one decoder layer on the fp32 residual stream in
// [T,H] and writes the result to out (fp32 [T,H]; out may be in), saving
// the activations in a. The ops follow HF: input RMSNorm; q/k/v
// projections (+bias); for Qwen3 a per-head RMSNorm of q and k; RoPE;
// causal varlen attention with scale 1/sqrt(head_dim); o_proj (+bias);
// mid = in + o_out in fp32; post-attention RMSNorm; gate and up
// projections; SwiGLU; down projection; out = mid + down_out. Activations
// are computed in the dtypes of a's tensors, weights in theirs.
//
// out may be the zero Tensor, as when the forward is rerun for the
// backward (activation checkpointing): the down projection and the last
// residual add are then skipped and a.DownOut is not used. A backend with
// GemmAdd (gemmAdder) adds the residual in the down product's epilogue and
// leaves a.DownOut unused too.
func (c *Config) LayerForward(b gpu.Backend, w LayerWeights, a *LayerActs, in, out gpu.Tensor, batch Batch) error {
	if err := c.layerForward(b, w, a, in, out, batch); err != nil {
		return fmt.Errorf("layer forward: %w", err)
	}
	return nil
}

func (c *Config) layerForward(b gpu.Backend, w LayerWeights, a *LayerActs, in, out gpu.Tensor, batch Batch) error {
	if err := c.checkBatch(b, batch); err != nil {
		return err
	}
	if err := c.checkWeights("weight", w); err != nil {
		return err
	}
	dm := c.dims(batch.T)
	withDown := out.Mem != nil
	lv, err := c.viewActs(a, dm, withDown, false)
	if err != nil {
		return err
	}
	in, err = flat2("in", in, dm.t, dm.h)
	if err != nil {
		return err
	}
	if withDown {
		if out, err = flat2("out", out, dm.t, dm.h); err != nil {
			return err
		}
	}
	eps := float32(c.RMSNormEps)
	if err := batch.enter("norm1"); err != nil {
		return err
	}
	if err := b.RMSNorm(lv.xn, lv.rstd1, in, w.InputNorm, eps); err != nil {
		return err
	}
	if err := batch.enter("qkv"); err != nil {
		return err
	}
	if err := c.qkvForward(b, w, lv, dm, batch); err != nil {
		return err
	}
	if err := batch.enter("attention"); err != nil {
		return err
	}
	if err := batch.attention(b, lv.attn, lv.lse, lv.q, lv.k, lv.v, c.AttentionScale()); err != nil {
		return err
	}
	if err := batch.enter("o_proj"); err != nil {
		return err
	}
	if err := b.Gemm(lv.oOut, lv.attn2, w.O, false, true, 1, 0); err != nil {
		return err
	}
	if c.OutputBias {
		if err := b.AddBias(lv.oOut, w.OBias); err != nil {
			return err
		}
	}
	if err := batch.enter("norm2"); err != nil {
		return err
	}
	if err := b.AddRMSNorm(lv.mid, lv.xn2, lv.rstd2, in, lv.oOut, w.PostNorm, eps); err != nil {
		return err
	}
	if err := batch.enter("gate_up"); err != nil {
		return err
	}
	fused, err := gateUpFused(b, lv, w, a.Transient, withDown)
	if err != nil {
		return err
	}
	if !fused {
		if err := b.Gemm(lv.gate, lv.xn2, w.Gate, false, true, 1, 0); err != nil {
			return err
		}
		if err := b.Gemm(lv.up, lv.xn2, w.Up, false, true, 1, 0); err != nil {
			return err
		}
	}
	if err := batch.enter("swiglu"); err != nil {
		return err
	}
	if !fused {
		if err := b.SwiGLU(lv.act, lv.gate, lv.up); err != nil {
			return err
		}
	}
	if !withDown {
		return nil
	}
	if err := batch.enter("down"); err != nil {
		return err
	}
	added, err := gemmAdded(b, out, lv.mid, lv.act, w.Down)
	if err != nil || added {
		return err
	}
	if err := b.Gemm(lv.downOut, lv.act, w.Down, false, true, 1, 0); err != nil {
		return err
	}
	return b.Add(out, lv.mid, lv.downOut)
}

// gemmAdder is a backend with a product that adds a residual in its
// epilogue (cuda.Backend through cuBLASLt), which refuses operands it does
// not take with an error wrapping gpu.ErrNotFused.
type gemmAdder interface {
	GemmAdd(d, c, a, b gpu.Tensor, transA, transB bool) error
}

// fusedDone reads a fused op's outcome: nil is done, an error wrapping
// gpu.ErrNotFused a refusal (the caller runs the op's steps instead), any
// other error a failure.
func fusedDone(err error) (bool, error) {
	if errors.Is(err, gpu.ErrNotFused) {
		return false, nil
	}
	return err == nil, err
}

// gemmAdded computes out = res + x·wᵀ as one op where b has one that takes
// the operands (the sum rounded once), and reports whether it did;
// otherwise the caller runs the product and the add.
func gemmAdded(b gpu.Backend, out, res, x, w gpu.Tensor) (bool, error) {
	f, ok := b.(gemmAdder)
	if !ok {
		return false, nil
	}
	return fusedDone(f.GemmAdd(out, res, x, w, false, true))
}

// gateUpSwiGLUer is a backend with the MLP's gate/up product and SwiGLU as
// one op (cuda.Backend on Hopper), which refuses operands it does not take
// with an error wrapping gpu.ErrNotFused: GateUpSwiGLU stores act alone,
// GateUpSwiGLUKeep the two products too (gOut, uOut), for a backward.
type gateUpSwiGLUer interface {
	GateUpSwiGLU(act, x, gate, up gpu.Tensor) error
	GateUpSwiGLUKeep(act, gOut, uOut, x, gate, up gpu.Tensor) error
}

// gateUpFused computes the layer's act = SwiGLU(xn2·gateᵀ, xn2·upᵀ) as one
// op where b has one that takes the operands, and reports whether it did;
// otherwise the caller runs the two products and SwiGLU. A transient
// forward (with its down projection) stores act alone; any other keeps the
// products in gate and up for the backward, and every forward of the
// layer, a backward's rerun (withDown false) too, takes the same op, so
// the rerun gives the forward's bits.
func gateUpFused(b gpu.Backend, lv layerViews, w LayerWeights, transient, withDown bool) (bool, error) {
	f, ok := b.(gateUpSwiGLUer)
	if !ok || transient && !withDown {
		return false, nil
	}
	if transient {
		return fusedDone(f.GateUpSwiGLU(lv.act, lv.xn2, w.Gate, w.Up))
	}
	return fusedDone(f.GateUpSwiGLUKeep(lv.act, lv.gate, lv.up, lv.xn2, w.Gate, w.Up))
}

// downSwiGLUBackwarder is a backend with the down projection's input
// gradient and SwiGLU's backward as one op (cuda.Backend on Hopper), which
// refuses operands it does not take with an error wrapping
// gpu.ErrNotFused: dGate and dUp from dy·down and the gate and up
// products (gpu.DownSwiGLUBackwardDims).
type downSwiGLUBackwarder interface {
	DownSwiGLUBackward(dGate, dUp, dy, down, gate, up gpu.Tensor) error
}

// downSwiGLUFused computes the layer's dgate and dup from dy as one op
// where b has one that takes the operands, and reports whether it did;
// otherwise the caller runs the product into dgate and SwiGLU's backward
// in place.
func downSwiGLUFused(b gpu.Backend, gv LayerGradBufs, w LayerWeights, lv layerViews) (bool, error) {
	f, ok := b.(downSwiGLUBackwarder)
	if !ok {
		return false, nil
	}
	return fusedDone(f.DownSwiGLUBackward(gv.Dgate, gv.Dup, gv.Dy, w.Down, lv.gate, lv.up))
}

// qkvRoPEr is a backend with the fused q, k and v projection, its biases
// and RoPE as one op (cuda.Backend on Hopper), which refuses operands it
// does not take with an error wrapping gpu.ErrNotFused.
type qkvRoPEr interface {
	QKVRoPE(q, k, v, x, w, bias, pos, scratch gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) error
}

// qkvRoPEd computes q, k and v from x and the fused weight w as one op
// where b has one that takes the operands (the product never in memory;
// the op may overwrite scratch, the product's buffer), and reports whether
// it did; otherwise the caller runs the product and QKVSplit.
func qkvRoPEd(b gpu.Backend, q, k, v, x, w, bias, pos, scratch gpu.Tensor, theta float64, scaling *gpu.RoPEScaling) (bool, error) {
	f, ok := b.(qkvRoPEr)
	if !ok {
		return false, nil
	}
	return fusedDone(f.QKVRoPE(q, k, v, x, w, bias, pos, scratch, theta, scaling))
}

// qkvForward computes q, k and v from xn: projections, biases, the Qwen3
// q/k norm and RoPE.
func (c *Config) qkvForward(b gpu.Backend, w LayerWeights, lv layerViews, dm dims, batch Batch) error {
	qd, kd := dm.hq*dm.d, dm.hkv*dm.d
	if lv.qkv.Mem != nil {
		wqkv, bqkv, err := c.fusedQKV(w)
		if err != nil {
			return err
		}
		done, err := qkvRoPEd(b, lv.q, lv.k, lv.v, lv.xn, wqkv, bqkv, batch.Positions, lv.qkv, c.RopeTheta, c.RoPEScaling())
		if err != nil || done {
			return err
		}
		if err := b.Gemm(lv.qkv, lv.xn, wqkv, false, true, 1, 0); err != nil {
			return err
		}
		return b.QKVSplit(lv.q, lv.k, lv.v, lv.qkv, bqkv, batch.Positions, c.RopeTheta, c.RoPEScaling())
	}
	proj := func(dst, wt, bias gpu.Tensor) error {
		if err := b.Gemm(dst, lv.xn, wt, false, true, 1, 0); err != nil {
			return err
		}
		if c.AttentionBias {
			return b.AddBias(dst, bias)
		}
		return nil
	}
	qOut, kOut := lv.q2, lv.k2
	if c.QKNorm {
		var err error
		if qOut, err = flat2("q_raw", lv.qraw, dm.t, qd); err != nil {
			return err
		}
		if kOut, err = flat2("k_raw", lv.kraw, dm.t, kd); err != nil {
			return err
		}
	}
	if err := proj(qOut, w.Q, w.QBias); err != nil {
		return err
	}
	if err := proj(kOut, w.K, w.KBias); err != nil {
		return err
	}
	if err := proj(lv.v2, w.V, w.VBias); err != nil {
		return err
	}
	if c.QKNorm {
		eps := float32(c.RMSNormEps)
		q, err := flat2("q", lv.q, dm.t*dm.hq, dm.d)
		if err != nil {
			return err
		}
		k, err := flat2("k", lv.k, dm.t*dm.hkv, dm.d)
		if err != nil {
			return err
		}
		if err := b.RMSNorm(q, lv.rstdQ, lv.qraw, w.QNorm, eps); err != nil {
			return err
		}
		if err := b.RMSNorm(k, lv.rstdK, lv.kraw, w.KNorm, eps); err != nil {
			return err
		}
	}
	rs := c.RoPEScaling()
	if err := b.RoPE(lv.q, batch.Positions, c.RopeTheta, rs); err != nil {
		return err
	}
	return b.RoPE(lv.k, batch.Positions, c.RopeTheta, rs)
}

// errFusedQKNorm refuses the fused q/k/v path (LayerActs.QKV,
// LayerGradBufs.Dqkv) for a config with Qwen3's per-head q/k norms, which
// sit between the projections and RoPE.
var errFusedQKNorm = errors.New("the fused q/k/v projection does not take Qwen3's q/k norms")

// fusedQKV returns the q, k and v projection weights of w (or of a
// gradient view of the same layout) as one [Hq·D+2·Hkv·D, H] matrix, and
// their biases as one vector when the config has them (else absent). They
// must lie next to each other in that order (Config.FusedQKV).
func (c *Config) fusedQKV(w LayerWeights) (wqkv, bqkv gpu.Tensor, err error) {
	if wqkv, err = adjacent("q/k/v weights", w.Q, w.K, w.V); err != nil {
		return gpu.Tensor{}, gpu.Tensor{}, err
	}
	if c.AttentionBias {
		if bqkv, err = adjacent("q/k/v biases", w.QBias, w.KBias, w.VBias); err != nil {
			return gpu.Tensor{}, gpu.Tensor{}, err
		}
	}
	return wqkv, bqkv, nil
}

// adjacent returns parts, which must follow each other in one memory with
// one dtype and the same trailing dimensions, as one tensor whose first
// dimension is the sum of theirs.
func adjacent(what string, parts ...gpu.Tensor) (gpu.Tensor, error) {
	first := parts[0]
	rows, next := 0, first.Off
	for _, p := range parts {
		if p.Mem == nil || p.Mem != first.Mem || p.DType != first.DType || p.Off != next ||
			len(p.Shape) != len(first.Shape) || !gpu.SameShape(p.Shape[1:], first.Shape[1:]) {
			return gpu.Tensor{}, fmt.Errorf("%s are not adjacent in one buffer, as the fused projection needs", what)
		}
		rows += p.Shape[0]
		next = p.Off + p.Bytes()
	}
	shape := append([]int{rows}, first.Shape[1:]...)
	return gpu.NewTensor(first.Mem, first.Off, first.DType, shape...)
}

// viewGrads checks and reshapes the gradient temporaries.
func viewGrads(g *LayerGradBufs, dm dims) (LayerGradBufs, error) {
	if g == nil {
		return LayerGradBufs{}, fmt.Errorf("gradient buffers are nil")
	}
	t, qd, kd := dm.t, dm.hq*dm.d, dm.hkv*dm.d
	var v LayerGradBufs
	reqs := []struct {
		name      string
		dst       *gpu.Tensor
		src       gpu.Tensor
		rows, col int
	}{
		{"dy", &v.Dy, g.Dy, t, dm.h},
		{"dgate", &v.Dgate, g.Dgate, t, dm.inter},
		{"dup", &v.Dup, g.Dup, t, dm.inter},
		{"dxn2", &v.Dxn2, g.Dxn2, t, dm.h},
		{"dy_o", &v.DyO, g.DyO, t, dm.h},
		{"dattn", &v.Dattn, g.Dattn, t, qd},
		{"dq", &v.Dq, g.Dq, t, qd},
		{"dk", &v.Dk, g.Dk, t, kd},
		{"dv", &v.Dv, g.Dv, t, kd},
		{"dxn", &v.Dxn, g.Dxn, t, dm.h},
	}
	for _, r := range reqs {
		x, err := shaped(r.name, r.src, r.rows, r.col)
		if err != nil {
			return v, err
		}
		*r.dst = x
	}
	if g.Dqkv.Mem != nil {
		x, err := shaped("dqkv", g.Dqkv, t, qd+2*kd)
		if err != nil {
			return v, err
		}
		v.Dqkv = x
	}
	return v, nil
}

// LayerBackward backpropagates through one decoder layer. dres (fp32
// [T,H]) holds d(loss)/d(out) on entry and d(loss)/d(in) on return (in
// place). in is the layer input that LayerForward read, and a the
// activations it saved (or that a rerun of LayerForward recomputed). dw
// holds gradient views with the layout of w (in the gradient dtype); every
// weight and bias gradient is accumulated into it. g holds the gradient
// temporaries; they are used in this order (each is dead after its last
// use, so a memory plan may overlap them accordingly):
//
//	dy    = dres (cast)            dW_down += dyᵀ·act
//	dgate = dy·W_down              (last use of dy; dact, in dgate)
//	dgate, dup = swiglu'(dgate)    in place; dW_gate, dW_up += ·ᵀ·xn2
//	                               (the two lines above one op where b
//	                               has it: downSwiGLUBackwarder)
//	dxn2  = dgate·W_gate + dup·W_up (last use of dgate, dup)
//	dres += rmsnorm'(dxn2); dy_o = dres (cast)   (one RMSNormBackwardAdd)
//	dW_o += dy_oᵀ·attn; o_proj bias grad
//	dattn = dy_o·W_o               (last use of dy_o)
//	dq, dk, dv = attention'(dattn); RoPE' and q/k norm' in place; bias
//	grads; dW_q, dW_k, dW_v += ·ᵀ·xn (last use of dattn)
//	dxn   = dq·W_q + dk·W_k + dv·W_v (last use of dq, dk, dv)
//	dres += rmsnorm'(dxn)            (RMSNormBackwardAdd)
func (c *Config) LayerBackward(b gpu.Backend, w, dw LayerWeights, a *LayerActs, g *LayerGradBufs, in, dres gpu.Tensor, batch Batch) error {
	if err := c.layerBackward(b, w, dw, a, g, in, dres, batch); err != nil {
		return fmt.Errorf("layer backward: %w", err)
	}
	return nil
}

func (c *Config) layerBackward(b gpu.Backend, w, dw LayerWeights, a *LayerActs, g *LayerGradBufs, in, dres gpu.Tensor, batch Batch) error {
	if err := c.checkBatch(b, batch); err != nil {
		return err
	}
	if err := c.checkWeights("weight", w); err != nil {
		return err
	}
	if err := c.checkWeights("gradient", dw); err != nil {
		return err
	}
	dm := c.dims(batch.T)
	lv, err := c.viewActs(a, dm, false, a != nil && a.Lean)
	if err != nil {
		return err
	}
	gv, err := viewGrads(g, dm)
	if err != nil {
		return err
	}
	if a.Lean {
		// Each recomputed activation lives in the temporary written only
		// after its last use (see LayerActs.Lean).
		lv.xn, lv.xn2, lv.act = gv.Dxn, gv.Dxn2, gv.Dgate
	}
	if in, err = flat2("in", in, dm.t, dm.h); err != nil {
		return err
	}
	if dres, err = flat2("dres", dres, dm.t, dm.h); err != nil {
		return err
	}
	if dres.DType != gpu.F32 {
		return fmt.Errorf("dres must be f32, got %v", dres.DType)
	}

	// MLP.
	if err := batch.enter("down backward"); err != nil {
		return err
	}
	if err := b.Copy(gv.Dy, dres); err != nil {
		return err
	}
	if a.Lean {
		if err := b.SwiGLU(lv.act, lv.gate, lv.up); err != nil {
			return err
		}
	}
	if err := b.Gemm(dw.Down, gv.Dy, lv.act, true, false, 1, 1); err != nil {
		return err
	}
	// dact = dy·W_down in dgate (a lean layer's act, which lived there, is
	// dead after dW_down), then SwiGLU's backward in place; or both as
	// one op, dact never stored.
	fused, err := downSwiGLUFused(b, gv, w, lv)
	if err != nil {
		return err
	}
	if !fused {
		if err := b.Gemm(gv.Dgate, gv.Dy, w.Down, false, false, 1, 0); err != nil {
			return err
		}
	}
	if err := batch.enter("swiglu backward"); err != nil {
		return err
	}
	if !fused {
		if err := b.SwiGLUBackward(gv.Dgate, gv.Dup, gv.Dgate, lv.gate, lv.up); err != nil {
			return err
		}
	}
	if err := batch.enter("gate_up backward"); err != nil {
		return err
	}
	eps := float32(c.RMSNormEps)
	if a.Lean {
		if err := b.RMSNorm(lv.xn2, lv.rstd2, lv.mid, w.PostNorm, eps); err != nil {
			return err
		}
	}
	if err := b.Gemm(dw.Gate, gv.Dgate, lv.xn2, true, false, 1, 1); err != nil {
		return err
	}
	if err := b.Gemm(dw.Up, gv.Dup, lv.xn2, true, false, 1, 1); err != nil {
		return err
	}
	if err := b.Gemm(gv.Dxn2, gv.Dgate, w.Gate, false, false, 1, 0); err != nil {
		return err
	}
	if err := b.Gemm(gv.Dxn2, gv.Dup, w.Up, false, false, 1, 1); err != nil {
		return err
	}
	if err := batch.enter("norm2 backward"); err != nil {
		return err
	}
	if err := b.RMSNormBackwardAdd(dres, gv.DyO, dw.PostNorm, gv.Dxn2, lv.mid, w.PostNorm, lv.rstd2); err != nil {
		return err
	}

	// Attention.
	if err := batch.enter("o_proj backward"); err != nil {
		return err
	}
	if c.OutputBias {
		if err := b.BiasGrad(dw.OBias, gv.DyO); err != nil {
			return err
		}
	}
	if err := b.Gemm(dw.O, gv.DyO, lv.attn2, true, false, 1, 1); err != nil {
		return err
	}
	if err := b.Gemm(gv.Dattn, gv.DyO, w.O, false, false, 1, 0); err != nil {
		return err
	}
	if err := c.qkvBackward(b, w, dw, lv, gv, dm, batch, qkvRecompute{a.Lean, in, eps}); err != nil {
		return err
	}
	if err := batch.enter("norm1 backward"); err != nil {
		return err
	}
	return b.RMSNormBackwardAdd(dres, gpu.Tensor{}, dw.InputNorm, gv.Dxn, in, w.InputNorm, lv.rstd1)
}

// qkvBackwardFused is qkvBackward's part after the attention backward for
// a fused projection (gv.Dqkv): dq, dk rotated back and dv packed into
// dqkv, the bias gradients from it, then one product for the three weight
// gradients and one for dxn.
func (c *Config) qkvBackwardFused(b gpu.Backend, w, dw LayerWeights, lv layerViews, gv LayerGradBufs, dq, dk, dv gpu.Tensor, batch Batch, rc qkvRecompute) error {
	if c.QKNorm {
		return errFusedQKNorm
	}
	wqkv, _, err := c.fusedQKV(w)
	if err != nil {
		return err
	}
	dwqkv, dbqkv, err := c.fusedQKV(dw)
	if err != nil {
		return fmt.Errorf("gradients: %w", err)
	}
	if err := b.QKVPack(gv.Dqkv, dq, dk, dv, batch.Positions, c.RopeTheta, c.RoPEScaling()); err != nil {
		return err
	}
	if c.AttentionBias {
		if err := b.BiasGrad(dbqkv, gv.Dqkv); err != nil {
			return err
		}
	}
	if rc.lean {
		if err := b.RMSNorm(lv.xn, lv.rstd1, rc.in, w.InputNorm, rc.eps); err != nil {
			return err
		}
	}
	if err := b.Gemm(dwqkv, gv.Dqkv, lv.xn, true, false, 1, 1); err != nil {
		return err
	}
	return b.Gemm(gv.Dxn, gv.Dqkv, wqkv, false, false, 1, 0)
}

// qkvRecompute says whether qkvBackward first recomputes xn (into gv.Dxn)
// from the layer input in (see LayerActs.Lean).
type qkvRecompute struct {
	lean bool
	in   gpu.Tensor
	eps  float32
}

// qkvBackward turns dattn into dxn (written to gv.Dxn), accumulating the
// projection, bias and q/k norm gradients. Every weight gradient is taken
// before dxn is first written, so that a recomputed xn may live in it.
func (c *Config) qkvBackward(b gpu.Backend, w, dw LayerWeights, lv layerViews, gv LayerGradBufs, dm dims, batch Batch, rc qkvRecompute) error {
	dattn, _ := gv.Dattn.Reshape(dm.t, dm.hq, dm.d)
	dq, _ := gv.Dq.Reshape(dm.t, dm.hq, dm.d)
	dk, _ := gv.Dk.Reshape(dm.t, dm.hkv, dm.d)
	dv, _ := gv.Dv.Reshape(dm.t, dm.hkv, dm.d)
	if err := batch.enter("attention backward"); err != nil {
		return err
	}
	if err := batch.attentionBackward(b, dq, dk, dv, dattn, lv.attn, lv.lse, lv.q, lv.k, lv.v, c.AttentionScale()); err != nil {
		return err
	}
	if err := batch.enter("qkv backward"); err != nil {
		return err
	}
	if gv.Dqkv.Mem != nil {
		return c.qkvBackwardFused(b, w, dw, lv, gv, dq, dk, dv, batch, rc)
	}
	rs := c.RoPEScaling()
	if err := b.RoPEBackward(dq, batch.Positions, c.RopeTheta, rs); err != nil {
		return err
	}
	if err := b.RoPEBackward(dk, batch.Positions, c.RopeTheta, rs); err != nil {
		return err
	}
	if c.QKNorm {
		dqh, _ := gv.Dq.Reshape(dm.t*dm.hq, dm.d)
		dkh, _ := gv.Dk.Reshape(dm.t*dm.hkv, dm.d)
		if err := b.RMSNormBackward(dqh, dw.QNorm, dqh, lv.qraw, w.QNorm, lv.rstdQ); err != nil {
			return err
		}
		if err := b.RMSNormBackward(dkh, dw.KNorm, dkh, lv.kraw, w.KNorm, lv.rstdK); err != nil {
			return err
		}
	}
	type proj struct {
		d, w, dwt, db gpu.Tensor
	}
	projs := []proj{{gv.Dq, w.Q, dw.Q, dw.QBias}, {gv.Dk, w.K, dw.K, dw.KBias}, {gv.Dv, w.V, dw.V, dw.VBias}}
	if rc.lean {
		if err := b.RMSNorm(lv.xn, lv.rstd1, rc.in, w.InputNorm, rc.eps); err != nil {
			return err
		}
	}
	for _, p := range projs {
		if c.AttentionBias {
			if err := b.BiasGrad(p.db, p.d); err != nil {
				return err
			}
		}
		if err := b.Gemm(p.dwt, p.d, lv.xn, true, false, 1, 1); err != nil {
			return err
		}
	}
	for i, p := range projs {
		beta := float32(1)
		if i == 0 {
			beta = 0
		}
		if err := b.Gemm(gv.Dxn, p.d, p.w, false, false, 1, beta); err != nil {
			return err
		}
	}
	return nil
}
