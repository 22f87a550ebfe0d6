//go:build cgo

package cuda

import (
	"errors"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// BenchmarkOps times the main ops at Qwen2.5-1.5B-like sizes (8192 tokens
// as 4 sequences of 2048, hidden 1536, 12 query and 2 kv heads of 128, MLP
// 8960, vocabulary 151936, log-prob chunks of 1024 tokens), one
// sub-benchmark per op, reporting TFLOP/s or GB/s besides ns/op:
//
//	go test -run '^$' -bench Ops -benchtime 5x ./gpu/cuda
//
// On Hopper the attention rows time the wgmma kernels, and the rows marked
// mma.sync the kernels other GPUs run. The fused gate/up row runs on
// Hopper only and skips elsewhere. Most operands are constant (0.01),
// unlike a model's: compare the gate/up kernel with the products through
// BenchmarkGateUpSwiGLU, whose operands are not (the two benchmarks
// ranked its versions differently; why was not measured).
//
// RLPIPE_CUDA_SCALAR=1 times the scalar elementwise and row kernels instead
// of the 8-wide ones. Without a driver it skips.
func BenchmarkOps(bb *testing.B) {
	b := backend(bb)
	const (
		T, H, Hq, Hkv, D, I, V, C = 8192, 1536, 12, 2, 128, 8960, 151936, 1024
	)
	mem, err := b.Alloc(7 << 30)
	if err != nil {
		bb.Fatal(err)
	}
	defer b.Free(mem)
	var off int64
	ten := func(dt gpu.DType, shape ...int) gpu.Tensor {
		x := benchTensor(bb, mem, &off, dt, shape...)
		if dt != gpu.I32 {
			if err := b.Fill(x, 0.01); err != nil {
				bb.Fatal(err)
			}
		}
		return x
	}
	// Random-ish data: a cheap scrambled pattern through AddScaled.
	x := ten(gpu.BF16, T, H)
	w1 := ten(gpu.BF16, I, H)
	y := ten(gpu.BF16, T, I)
	q := ten(gpu.BF16, T, Hq, D)
	k := ten(gpu.BF16, T, Hkv, D)
	v := ten(gpu.BF16, T, Hkv, D)
	o := ten(gpu.BF16, T, Hq, D)
	lse := ten(gpu.F32, Hq, T)
	dq := ten(gpu.BF16, T, Hq, D)
	dk := ten(gpu.BF16, T, Hkv, D)
	dv := ten(gpu.BF16, T, Hkv, D)
	cu := ten(gpu.I32, 5)
	_ = b.UploadI32(cu, []int32{0, 2048, 4096, 6144, 8192})
	rnd := scrambled(T*Hq*D, 1)
	_ = b.Upload(q, rnd)
	_ = b.Upload(k, rnd[:T*Hkv*D])
	_ = b.Upload(v, rnd[T*Hkv*D:2*T*Hkv*D])
	_ = b.Upload(x, rnd[:T*H])
	wv := ten(gpu.BF16, V, H)
	hc := ten(gpu.BF16, C, H)
	tg := ten(gpu.I32, C)
	tgs := make([]int32, C)
	for i := range tgs {
		tgs[i] = int32(i * 97 % V)
	}
	_ = b.UploadI32(tg, tgs)
	logits := ten(gpu.F32, C, V)
	logp := ten(gpu.F32, C)
	ent := ten(gpu.F32, C)
	dlogp := ten(gpu.F32, C)
	dhc := ten(gpu.BF16, C, H)
	dwv := ten(gpu.F32, V, H)
	ids := ten(gpu.I32, T)
	idv := make([]int32, T)
	for i := range idv {
		idv[i] = int32(i * 7919 % V)
	}
	_ = b.UploadI32(ids, idv)
	rstd := ten(gpu.F32, T)
	dx := ten(gpu.BF16, T, H)
	du := ten(gpu.BF16, T, I)
	nw := ten(gpu.BF16, H)
	gate := ten(gpu.BF16, T, I)
	up := ten(gpu.BF16, T, I)
	np := 50_000_000
	p, g, m, vv := ten(gpu.F32, np), ten(gpu.F32, np), ten(gpu.F32, np), ten(gpu.F32, np)
	pb := ten(gpu.BF16, np)
	nwg := ten(gpu.F32, H)
	k2, _ := k.Reshape(T, Hkv*D)
	bk := ten(gpu.F32, Hkv*D)
	// Qwen3-style per-head norms: 8192 tokens × 16 heads of 128.
	xq, xq2 := ten(gpu.BF16, T*16, 128), ten(gpu.BF16, T*16, 128)
	rstdq, nwq, nwgq := ten(gpu.F32, T*16), ten(gpu.BF16, 128), ten(gpu.F32, 128)
	// The decoder's norm backward at 3B: float32 residual rows of 2048,
	// 16384 tokens, the grad added into a float32 sum and cast to bf16.
	const H3, T3 = 2048, 8 * 2048
	xn3, accr := ten(gpu.F32, T3, H3), ten(gpu.F32, T3, H3)
	dyr, castr := ten(gpu.BF16, T3, H3), ten(gpu.BF16, T3, H3)
	rstdr, nwr, dwr := ten(gpu.F32, T3), ten(gpu.BF16, H3), ten(gpu.F32, H3)
	_ = b.Upload(dyr, scrambled(T3*H3, 1))
	// The same at 1.5B (rows of 1536), in the first elements of those.
	v15 := func(x gpu.Tensor, shape ...int) gpu.Tensor {
		y, err := gpu.NewTensor(x.Mem, x.Off, x.DType, shape...)
		if err != nil {
			bb.Fatal(err)
		}
		return y
	}
	const H15 = 1536
	xn15, acc15, dy15, cast15 := v15(xn3, T3, H15), v15(accr, T3, H15), v15(dyr, T3, H15), v15(castr, T3, H15)
	nw15, dw15 := v15(nwr, H15), v15(dwr, H15)
	if err := b.Sync(); err != nil {
		bb.Fatal(err)
	}
	attnFlops := 0.0
	for range 4 {
		attnFlops += 2 * 2 * float64(2048) * float64(2048+1) / 2 * D * Hq
	}
	// One packed batch of 8 sequences of 2048 tokens (16384 tokens), at
	// head dims 128 (Qwen2.5-1.5B: 12 query and 2 kv heads) and 64
	// (Qwen2.5-0.5B: 14 and 2).
	const T8 = 8 * 2048
	cu8 := ten(gpu.I32, 9)
	cu8v := make([]int32, 9)
	for i := range cu8v {
		cu8v[i] = int32(i * 2048)
	}
	_ = b.UploadI32(cu8, cu8v)
	type attn8 struct{ q, k, v, o, lse, dq, dk, dv gpu.Tensor }
	// fillQKV writes a scrambled pattern into a's q, k, v and o, of n
	// tokens.
	fillQKV := func(a attn8, n, hq, hkv, d int) {
		r := scrambled(n*hq*d, 1)
		_ = b.Upload(a.q, r)
		_ = b.Upload(a.k, r[:n*hkv*d])
		_ = b.Upload(a.v, r[n*hkv*d:2*n*hkv*d])
		_ = b.Upload(a.o, r[len(r)-n*hq*d:])
	}
	mk8 := func(hq, hkv, d int) attn8 {
		a := attn8{q: ten(gpu.BF16, T8, hq, d), k: ten(gpu.BF16, T8, hkv, d), v: ten(gpu.BF16, T8, hkv, d),
			o: ten(gpu.BF16, T8, hq, d), lse: ten(gpu.F32, hq, T8), dq: ten(gpu.BF16, T8, hq, d),
			dk: ten(gpu.BF16, T8, hkv, d), dv: ten(gpu.BF16, T8, hkv, d)}
		fillQKV(a, T8, hq, hkv, d)
		return a
	}
	a128, a64 := mk8(Hq, Hkv, D), mk8(14, 2, 64)
	flops8 := func(hq, d int) float64 { return 8 * 2 * 2 * 2048 * 2049 / 2 * float64(d*hq) }
	// Two sequences of 16384 tokens (long reasoning rollouts), forward
	// only, at head dim 128.
	const TL = 2 * 16384
	cuL := ten(gpu.I32, 3)
	_ = b.UploadI32(cuL, []int32{0, 16384, TL})
	aL := attn8{q: ten(gpu.BF16, TL, Hq, D), k: ten(gpu.BF16, TL, Hkv, D), v: ten(gpu.BF16, TL, Hkv, D),
		o: ten(gpu.BF16, TL, Hq, D), lse: ten(gpu.F32, Hq, TL)}
	fillQKV(aL, TL, Hq, Hkv, D)
	flopsL := 2 * 2 * 2 * 16384 * 16385 / 2 * float64(D*Hq)
	fwdL := func() error { return b.Attention(aL.o, aL.lse, aL.q, aL.k, aL.v, cuL, 0.088) }
	// ws runs f on the warp-specialised forward, its consumers taking
	// turns with pp.
	ws := func(pp bool, f func() error) func() error {
		return func() error {
			defer func(w, p bool) { attnFwdWS, attnFwdPingpong = w, p }(attnFwdWS, attnFwdPingpong)
			attnFwdWS, attnFwdPingpong = true, pp
			return f()
		}
	}
	// cpAsync runs f with the backward's passes fed by cp.async, not the
	// TMA.
	cpAsync := func(f func() error) func() error {
		return func() error {
			defer func(v bool) { attnBwdTMA = v }(attnBwdTMA)
			attnBwdTMA = false
			return f()
		}
	}
	wg := func(f func() error) func() error {
		return func() error {
			defer func(w bool) { attnFwdWS = w }(attnFwdWS)
			attnFwdWS = false
			return f()
		}
	}
	simt := func(f func() error) func() error {
		return func() error {
			attnSIMTOnly = true
			defer func() { attnSIMTOnly = false }()
			return f()
		}
	}
	mmaSync := func(f func() error) func() error {
		return func() error {
			attnNoWgmma = true
			defer func() { attnNoWgmma = false }()
			return f()
		}
	}
	only := func(pass string, f func() error) func() error {
		return func() error {
			attnBwdOnly = pass
			defer func() { attnBwdOnly = "" }()
			return f()
		}
	}
	fwd8 := func(a attn8, scale float32) func() error {
		return func() error { return b.Attention(a.o, a.lse, a.q, a.k, a.v, cu8, scale) }
	}
	bwd8 := func(a attn8, scale float32) func() error {
		return func() error { return b.AttentionBackward(a.dq, a.dk, a.dv, a.o, a.o, a.lse, a.q, a.k, a.v, cu8, scale) }
	}
	// Ring attention's blocks at cp 2 (zigzag): in each of the 8
	// sequences, the late chunk's 1024 query rows see all 2048 rows of
	// another rank; on the SIMT kernels and, with spansWgmma, the wgmma ones.
	var spans8 []gpu.Span
	for sq := range 8 {
		spans8 = append(spans8, gpu.Span{Q: sq*2048 + 1024, QLen: 1024, K: sq * 2048, KLen: 2048})
	}
	spanFlops := 8 * 4 * 1024 * 2048 * float64(Hq*D)
	spans := func(wg, backward bool) func() error {
		return func() error {
			defer func(v bool) { spansWgmma = v }(spansWgmma)
			spansWgmma = wg
			a := a128
			if backward {
				return b.AttentionSpansBackward(a.dq, a.dk, a.dv, a.o, a.o, a.lse, a.q, a.k, a.v, spans8, 0.088)
			}
			return b.AttentionSpans(a.o, a.lse, a.q, a.k, a.v, spans8, 0.088)
		}
	}
	// The q/k/v projections of a 1.5B layer on 16384 tokens, as three
	// products with their biases and RoPE, and fused (one product,
	// QKVSplit; QKVPack, one product each for the weight and input
	// gradients).
	const NQ = (Hq + 2*Hkv) * D
	x16, dx16 := ten(gpu.BF16, T8, H), ten(gpu.BF16, T8, H)
	wqkv, dwqkv := ten(gpu.BF16, NQ, H), ten(gpu.BF16, NQ, H)
	bqkv, dbqkv := ten(gpu.BF16, NQ), ten(gpu.BF16, NQ)
	qkv16 := ten(gpu.BF16, T8, NQ)
	q16, k16, v16 := ten(gpu.BF16, T8, Hq*D), ten(gpu.BF16, T8, Hkv*D), ten(gpu.BF16, T8, Hkv*D)
	pos16 := ten(gpu.I32, T8)
	pv := make([]int32, T8)
	for i := range pv {
		pv[i] = int32(i % 2048)
	}
	_ = b.UploadI32(pos16, pv)
	xr := scrambled(T8*NQ, 1)
	_ = b.Upload(x16, xr[:T8*H])
	_ = b.Upload(wqkv, xr[:NQ*H])
	_ = b.Upload(qkv16, xr[:T8*NQ])
	part := func(t gpu.Tensor, r0, r1 int) gpu.Tensor {
		cols := 1
		if len(t.Shape) == 2 {
			cols = t.Shape[1]
		}
		v, err := t.Flat(r0*cols, r1*cols)
		if err != nil {
			bb.Fatal(err)
		}
		if cols > 1 {
			v, _ = v.Reshape(r1-r0, cols)
		}
		return v
	}
	qr, kr := [2]int{0, Hq * D}, [2]int{Hq * D, (Hq + Hkv) * D}
	vr := [2]int{(Hq + Hkv) * D, NQ}
	type proj struct{ out, w, dw, bias, db gpu.Tensor }
	projs := []proj{
		{q16, part(wqkv, qr[0], qr[1]), part(dwqkv, qr[0], qr[1]), part(bqkv, qr[0], qr[1]), part(dbqkv, qr[0], qr[1])},
		{k16, part(wqkv, kr[0], kr[1]), part(dwqkv, kr[0], kr[1]), part(bqkv, kr[0], kr[1]), part(dbqkv, kr[0], kr[1])},
		{v16, part(wqkv, vr[0], vr[1]), part(dwqkv, vr[0], vr[1]), part(bqkv, vr[0], vr[1]), part(dbqkv, vr[0], vr[1])},
	}
	q3, _ := q16.Reshape(T8, Hq, D)
	k3, _ := k16.Reshape(T8, Hkv, D)
	v3, _ := v16.Reshape(T8, Hkv, D)
	qkvSeparate := func() error {
		for _, p := range projs {
			if err := b.Gemm(p.out, x16, p.w, false, true, 1, 0); err != nil {
				return err
			}
			if err := b.AddBias(p.out, p.bias); err != nil {
				return err
			}
		}
		if err := b.RoPE(q3, pos16, 1e6, nil); err != nil {
			return err
		}
		return b.RoPE(k3, pos16, 1e6, nil)
	}
	qkvFused := func() error {
		if err := b.Gemm(qkv16, x16, wqkv, false, true, 1, 0); err != nil {
			return err
		}
		return b.QKVSplit(q3, k3, v3, qkv16, bqkv, pos16, 1e6, nil)
	}
	qkvSeparateBwd := func() error {
		if err := b.RoPEBackward(q3, pos16, 1e6, nil); err != nil {
			return err
		}
		if err := b.RoPEBackward(k3, pos16, 1e6, nil); err != nil {
			return err
		}
		for _, p := range projs {
			if err := b.BiasGrad(p.db, p.out); err != nil {
				return err
			}
			if err := b.Gemm(p.dw, p.out, x16, true, false, 1, 1); err != nil {
				return err
			}
		}
		for i, p := range projs {
			if err := b.Gemm(dx16, p.out, p.w, false, false, 1, float32(min(i, 1))); err != nil {
				return err
			}
		}
		return nil
	}
	qkvFusedBwd := func() error {
		if err := b.QKVPack(qkv16, q3, k3, v3, pos16, 1e6, nil); err != nil {
			return err
		}
		if err := b.BiasGrad(dbqkv, qkv16); err != nil {
			return err
		}
		if err := b.Gemm(dwqkv, qkv16, x16, true, false, 1, 1); err != nil {
			return err
		}
		return b.Gemm(dx16, qkv16, wqkv, false, false, 1, 0)
	}
	qkvFlops := 2.0 * T8 * H * NQ
	cases := []struct {
		name  string
		flops float64
		bytes float64
		f     func() error
	}{
		{"qkv fwd 16384x1536 12/2x128 separate", qkvFlops, 0, qkvSeparate},
		{"qkv fwd 16384x1536 12/2x128 fused", qkvFlops, 0, qkvFused},
		{"qkv bwd 16384x1536 12/2x128 separate", 2 * qkvFlops, 0, qkvSeparateBwd},
		{"qkv bwd 16384x1536 12/2x128 fused", 2 * qkvFlops, 0, qkvFusedBwd},
		{"qkv split 16384 12/2x128 bf16 +bias", 0, 2 * 2 * T8 * NQ, func() error { return b.QKVSplit(q3, k3, v3, qkv16, bqkv, pos16, 1e6, nil) }},
		{"qkv pack 16384 12/2x128 bf16", 0, 2 * 2 * T8 * NQ, func() error { return b.QKVPack(qkv16, q3, k3, v3, pos16, 1e6, nil) }},
		{"gemm bf16 8192x8960x1536", 2 * T * I * H, 0, func() error { return b.Gemm(y, x, w1, false, true, 1, 0) }},
		// Against two of the row above and a swiglu fwd.
		{"gate/up swiglu fused 8192x8960x1536", 2 * 2 * T * I * H, 0, func() error { return b.GateUpSwiGLU(y, x, w1, w1) }},
		{"attention fwd 4x2048 bf16", attnFlops, 0, func() error { return b.Attention(o, lse, q, k, v, cu, 0.088) }},
		{"attention bwd 4x2048 bf16", 2.5 * attnFlops, 0, func() error {
			return b.AttentionBackward(dq, dk, dv, o, o, lse, q, k, v, cu, 0.088)
		}},
		{"attention fwd 8x2048 h12/2 d128 SIMT", flops8(Hq, D), 0, simt(fwd8(a128, 0.088))},
		{"attention bwd 8x2048 h12/2 d128 SIMT", 2.5 * flops8(Hq, D), 0, simt(bwd8(a128, 0.088))},
		{"attention fwd 8x2048 h12/2 d128", flops8(Hq, D), 0, fwd8(a128, 0.088)},
		{"attention fwd 8x2048 h12/2 d128 wg", flops8(Hq, D), 0, wg(fwd8(a128, 0.088))},
		{"attention fwd 8x2048 h12/2 d128 ws", flops8(Hq, D), 0, ws(false, fwd8(a128, 0.088))},
		{"attention fwd 8x2048 h12/2 d128 ws pingpong", flops8(Hq, D), 0, ws(true, fwd8(a128, 0.088))},
		{"attention fwd 8x2048 h14/2 d64 wg", flops8(14, 64), 0, wg(fwd8(a64, 0.125))},
		{"attention fwd 8x2048 h14/2 d64 ws", flops8(14, 64), 0, ws(false, fwd8(a64, 0.125))},
		{"attention fwd 8x2048 h14/2 d64 ws pingpong", flops8(14, 64), 0, ws(true, fwd8(a64, 0.125))},
		{"attention fwd 2x16384 h12/2 d128 wg", flopsL, 0, wg(fwdL)},
		{"attention fwd 2x16384 h12/2 d128 ws", flopsL, 0, ws(false, fwdL)},
		{"attention fwd 2x16384 h12/2 d128 ws pingpong", flopsL, 0, ws(true, fwdL)},
		{"attention bwd 8x2048 h12/2 d128", 2.5 * flops8(Hq, D), 0, bwd8(a128, 0.088)},
		{"attention fwd 8x2048 h14/2 d64", flops8(14, 64), 0, fwd8(a64, 0.125)},
		{"attention bwd 8x2048 h14/2 d64", 2.5 * flops8(14, 64), 0, bwd8(a64, 0.125)},
		{"attention spans fwd 8x1024x2048 h12/2 d128 SIMT", spanFlops, 0, spans(false, false)},
		{"attention spans bwd 8x1024x2048 h12/2 d128 SIMT", 2.5 * spanFlops, 0, spans(false, true)},
		{"attention spans fwd 8x1024x2048 h12/2 d128 wgmma", spanFlops, 0, wg(spans(true, false))},
		{"attention spans fwd 8x1024x2048 h12/2 d128 ws", spanFlops, 0, ws(true, spans(true, false))},
		{"attention spans bwd 8x1024x2048 h12/2 d128 wgmma", 2.5 * spanFlops, 0, spans(true, true)},
		{"attention bwd 8x2048 h12/2 d128 dq pass", 0, 0, only("dq", bwd8(a128, 0.088))},
		{"attention bwd 8x2048 h12/2 d128 dk/dv pass", 0, 0, only("dkv", bwd8(a128, 0.088))},
		{"attention bwd 8x2048 h12/2 d128 dk/dv pass cp.async", 0, 0, cpAsync(only("dkv", bwd8(a128, 0.088)))},
		{"attention bwd 8x2048 h12/2 d128 dq pass cp.async", 0, 0, cpAsync(only("dq", bwd8(a128, 0.088)))},
		{"attention bwd 8x2048 h12/2 d128 cp.async", 2.5 * flops8(Hq, D), 0, cpAsync(bwd8(a128, 0.088))},
		{"attention bwd 8x2048 h14/2 d64 cp.async", 2.5 * flops8(14, 64), 0, cpAsync(bwd8(a64, 0.125))},
		{"attention fwd 8x2048 h12/2 d128 mma.sync", flops8(Hq, D), 0, mmaSync(fwd8(a128, 0.088))},
		{"attention bwd 8x2048 h12/2 d128 mma.sync", 2.5 * flops8(Hq, D), 0, mmaSync(bwd8(a128, 0.088))},
		{"attention fwd 8x2048 h14/2 d64 mma.sync", flops8(14, 64), 0, mmaSync(fwd8(a64, 0.125))},
		{"attention bwd 8x2048 h14/2 d64 mma.sync", 2.5 * flops8(14, 64), 0, mmaSync(bwd8(a64, 0.125))},
		{"logprobs fwd 1024x151936 bf16 +entropy", 2 * C * V * H, 0, func() error {
			return b.LogProbs(logp, ent, hc, wv, tg, 1, false, logits, gpu.Tensor{})
		}},
		{"logprobs bwd 1024x151936 bf16", 3 * 2 * C * V * H, 0, func() error {
			return b.LogProbsBackward(dhc, dwv, dlogp, gpu.Tensor{}, hc, wv, tg, 1, false, logits)
		}},
		{"rmsnorm fwd 8192x1536 bf16", 0, 2 * 2 * T * H, func() error { return b.RMSNorm(x, rstd, x, nw, 1e-6) }},
		{"rmsnorm bwd 8192x1536 bf16", 0, 3 * 2 * T * H, func() error {
			return b.RMSNormBackward(dx, gpu.Tensor{}, dx, x, nw, rstd)
		}},
		{"rmsnorm bwd 8192x1536 bf16 +dw f32", 0, 3 * 2 * T * H, func() error {
			return b.RMSNormBackward(dx, nwg, dx, x, nw, rstd)
		}},
		// x read, dy read, the sum read and written, the cast written.
		{"rmsnorm bwd add 16384x2048 f32 rows, bf16 dy, +cast +dw f32", 0, (4 + 2 + 8 + 2) * T8 * H3, func() error {
			return b.RMSNormBackwardAdd(accr, castr, dwr, dyr, xn3, nwr, rstdr)
		}},
		{"rmsnorm bwd add 16384x2048 f32 rows, bf16 dy, +dw f32", 0, (4 + 2 + 8) * T8 * H3, func() error {
			return b.RMSNormBackwardAdd(accr, gpu.Tensor{}, dwr, dyr, xn3, nwr, rstdr)
		}},
		{"rmsnorm bwd add 16384x1536 f32 rows, bf16 dy, +cast +dw f32", 0, (4 + 2 + 8 + 2) * T8 * H15, func() error {
			return b.RMSNormBackwardAdd(acc15, cast15, dw15, dy15, xn15, nw15, rstdr)
		}},
		{"rmsnorm bwd add 16384x1536 f32 rows, bf16 dy, +dw f32", 0, (4 + 2 + 8) * T8 * H15, func() error {
			return b.RMSNormBackwardAdd(acc15, gpu.Tensor{}, dw15, dy15, xn15, nw15, rstdr)
		}},
		{"rmsnorm bwd 8192x1536 bf16 +dw f32, dx apart", 0, 3 * 2 * T * H, func() error {
			return b.RMSNormBackward(dx, nwg, x, x, nw, rstd)
		}},
		{"rmsnorm fwd 131072x128 bf16 (q/k norm)", 0, 2 * 2 * T * H, func() error { return b.RMSNorm(xq, rstdq, xq, nwq, 1e-6) }},
		{"rmsnorm bwd 131072x128 bf16 +dw f32 (q/k norm)", 0, 3 * 2 * T * H, func() error {
			return b.RMSNormBackward(xq, nwgq, xq, xq2, nwq, rstdq)
		}},
		{"add 8192x1536 bf16", 0, 3 * 2 * T * H, func() error { return b.Add(dx, dx, x) }},
		{"cast 50M f32->bf16", 0, 6 * float64(np), func() error { return b.Copy(pb, p) }},
		{"swiglu fwd 8192x8960 bf16", 0, 3 * 2 * T * I, func() error { return b.SwiGLU(y, gate, up) }},
		{"swiglu bwd 8192x8960 bf16", 0, 5 * 2 * T * I, func() error { return b.SwiGLUBackward(y, du, y, gate, up) }},
		{"rope fwd 8192x12x128 bf16", 0, 2 * 2 * T * Hq * D, func() error { return b.RoPE(q, ids, 1e6, nil) }},
		{"rope fwd 8192x2x128 bf16", 0, 2 * 2 * T * Hkv * D, func() error { return b.RoPE(k, ids, 1e6, nil) }},
		{"addbias 8192x1536 bf16", 0, 2 * 2 * T * H, func() error { return b.AddBias(x, nw) }},
		{"biasgrad 8192x1536 bf16 into f32", 0, 2 * T * H, func() error { return b.BiasGrad(nwg, x) }},
		{"biasgrad 8192x256 bf16 into f32", 0, 2 * T * Hkv * D, func() error { return b.BiasGrad(bk, k2) }},
		{"embedding bwd 8192x1536 into f32", 0, 3 * 4 * T * H, func() error { return b.EmbeddingBackward(dwv, x, ids) }},
		{"adamw 50M f32", 0, 7 * 4 * float64(np), func() error {
			return b.AdamW(p, g, m, vv, gpu.AdamWStep{LR: 1e-5, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: 1})
		}},
		{"sumsquares 50M f32", 0, 4 * float64(np), func() error { _, err := b.SumSquares(g); return err }},
	}
	for _, c := range cases {
		timeOp(bb, b, c.name, c.flops, c.bytes, c.f)
	}
}

// benchTensor views a tensor of dt and shape at byte offset *off of mem
// and moves *off past it, to the next 256-byte boundary.
func benchTensor(bb *testing.B, mem gpu.Memory, off *int64, dt gpu.DType, shape ...int) gpu.Tensor {
	bb.Helper()
	x, err := gpu.NewTensor(mem, *off, dt, shape...)
	if err != nil {
		bb.Fatal(err)
	}
	*off += (x.Bytes() + 255) / 256 * 256
	return x
}

// benchScrambled is benchTensor of a bf16 operand of shape, uploaded with
// scrambled values of scale where scale is not 0 (left as it is
// otherwise: an output).
func benchScrambled(bb *testing.B, b *Backend, mem gpu.Memory, off *int64, scale float32, shape ...int) gpu.Tensor {
	bb.Helper()
	x := benchTensor(bb, mem, off, gpu.BF16, shape...)
	if scale != 0 {
		if err := b.Upload(x, scrambled(x.Numel(), scale)); err != nil {
			bb.Fatal(err)
		}
	}
	return x
}

// timeOp times f on b as sub-benchmark name of bb: a warm-up run (an op
// this GPU does not fuse skips), then sb.N runs between syncs, reporting
// TFLOP/s for flops and GB/s for bytes a run where they are not 0.
func timeOp(bb *testing.B, b *Backend, name string, flops, bytes float64, f func() error) {
	bb.Run(name, func(sb *testing.B) {
		if err := f(); errors.Is(err, gpu.ErrNotFused) {
			sb.Skip(err)
		} else if err != nil {
			sb.Fatal(err)
		}
		if err := b.Sync(); err != nil {
			sb.Fatal(err)
		}
		sb.ResetTimer()
		for range sb.N {
			if err := f(); err != nil {
				sb.Fatal(err)
			}
		}
		if err := b.Sync(); err != nil {
			sb.Fatal(err)
		}
		sb.StopTimer()
		sec := sb.Elapsed().Seconds() / float64(sb.N)
		if flops > 0 {
			sb.ReportMetric(flops/sec/1e12, "TFLOP/s")
		}
		if bytes > 0 {
			sb.ReportMetric(bytes/sec/1e9, "GB/s")
		}
	})
}

// scrambled is the benchmarks' stand-in for data: n values in
// [-scale/2, scale/2) from a multiplicative hash of their index.
func scrambled(n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = scale * (float32((i*2654435761)%1000)/1000 - 0.5)
	}
	return v
}
