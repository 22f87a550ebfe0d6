//go:build cgo

package cuda

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/rlpipe/rlpipe/gpu"
)

// The blocks of context parallelism's ring attention (see
// gpu/cpu/attention_spans.go for the ops' contract): non-causal attention
// between row spans, forward and backward, on the SIMT kernels of
// kernels/attention.cu with the Spans range policy, and the log-sum-exp
// merge of blocks.

// spansWgmma runs span attention on Hopper's wgmma kernels
// (k_wg_spans_fwd_*, and k_wg_spans_pre_*, _dkv_* and _dq_* for the
// backward) for 16-bit operands at head dim 64 or 128 on Hopper GPUs.
// RLPIPE_CUDA_SPANS_WGMMA=0 turns them off, to time the SIMT kernels
// against them; TestAttentionSpans runs both paths.
var spansWgmma = os.Getenv("RLPIPE_CUDA_SPANS_WGMMA") != "0"

// spanCache holds the device copies of up to gpu.SpanLayouts span
// layouts: for every query row its key range and for every key row its
// query range.
type spanCache struct {
	mu      sync.Mutex
	entries map[string]spanRanges
}

type spanRanges struct {
	mem    gpu.Memory
	qk, kq uint64
}

// freeSpans releases the backend's span layouts (Close).
func (b *Backend) freeSpans() error {
	sc := &b.d.spans
	sc.mu.Lock()
	defer sc.mu.Unlock()
	var first error
	for k, e := range sc.entries {
		if err := b.Free(e.mem); err != nil && first == nil {
			first = err
		}
		delete(sc.entries, k)
	}
	return first
}

// spanRanges returns the device layout of spans over tq query and tk key
// rows, uploading it when it is not cached (a full cache is emptied
// first, which waits for the device).
func (b *Backend) spanRanges(tq, tk int, spans []gpu.Span) (spanRanges, error) {
	var key strings.Builder
	key.WriteString(strconv.Itoa(tq) + "," + strconv.Itoa(tk))
	for _, s := range spans {
		fmt.Fprintf(&key, ";%d,%d,%d,%d", s.Q, s.QLen, s.K, s.KLen)
	}
	sc := &b.d.spans
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.entries == nil {
		sc.entries = map[string]spanRanges{}
	}
	if e, ok := sc.entries[key.String()]; ok {
		return e, nil
	}
	if len(sc.entries) >= gpu.SpanLayouts {
		for k, e := range sc.entries {
			if err := b.Free(e.mem); err != nil {
				return spanRanges{}, err
			}
			delete(sc.entries, k)
		}
	}
	host := make([]int32, 2*(tq+tk))
	qk, kq := host[:2*tq], host[2*tq:]
	for _, s := range spans {
		for i := s.Q; i < s.Q+s.QLen; i++ {
			qk[2*i], qk[2*i+1] = int32(s.K), int32(s.K+s.KLen)
		}
		for j := s.K; j < s.K+s.KLen; j++ {
			kq[2*j], kq[2*j+1] = int32(s.Q), int32(s.Q+s.QLen)
		}
	}
	mem, err := b.Alloc(int64(4 * len(host)))
	if err != nil {
		return spanRanges{}, err
	}
	t, err := gpu.NewTensor(mem, 0, gpu.I32, len(host))
	if err == nil {
		err = b.UploadI32(t, host)
	}
	if err != nil {
		b.Free(mem)
		return spanRanges{}, err
	}
	base := mem.(*DeviceMemory).ptr
	e := spanRanges{mem: mem, qk: base, kq: base + uint64(8*tq)}
	sc.entries[key.String()] = e
	return e, nil
}

// spanArgs are the checked operands of a spans call.
type spanArgs struct {
	tq, tk, hq, hkv, d int
	q, k, v            uint64
	r                  spanRanges
}

func (b *Backend) spansCheck(op string, q, k, v gpu.Tensor, spans []gpu.Span, scale float32) (spanArgs, error) {
	var a spanArgs
	var err error
	if a.tq, a.tk, a.hq, a.hkv, a.d, err = gpu.SpanAttentionDims(op, q, k, v, spans, scale); err != nil {
		return a, err
	}
	if a.d > attMaxD {
		return a, fmt.Errorf("%s: head dim %d exceeds %d", op, a.d, attMaxD)
	}
	for _, x := range []struct {
		n string
		t gpu.Tensor
		p *uint64
	}{{"q", q, &a.q}, {"k", k, &a.k}, {"v", v, &a.v}} {
		if *x.p, err = b.faddr(op, x.n, x.t); err != nil {
			return a, err
		}
	}
	if a.tq > 0 && a.tk > 0 && a.hq > 0 {
		a.r, err = b.spanRanges(a.tq, a.tk, spans)
	}
	return a, err
}

// AttentionSpans is non-causal grouped-query attention between row spans:
// the query rows of each span attend every key row of it. It writes out
// [Tq,Hq,D] and lse F32 [Hq,Tq], 0 and −Inf for rows in no span. SIMT
// kernel, or with spansWgmma the wgmma one (with attnFwdWS, the
// warp-specialised one).
func (b *Backend) AttentionSpans(out, lse, q, k, v gpu.Tensor, spans []gpu.Span, scale float32) error {
	const op = "attention spans"
	a, err := b.spansCheck(op, q, k, v, spans, scale)
	if err != nil {
		return err
	}
	if err := gpu.CheckSpanAttention(op, out, lse, a.tq, a.hq, a.d); err != nil {
		return err
	}
	oa, la, err := b.outLSE(op, "out,lse", out, lse)
	if err != nil {
		return err
	}
	if a.tq == 0 || a.hq == 0 {
		return nil
	}
	if a.tk == 0 {
		// No key: every row is in no span.
		if err := b.Zero(out); err != nil {
			return err
		}
		return b.Fill(lse, float32(math.Inf(-1)))
	}
	d := a.d
	if sfx := faSuffix(d, []gpu.Tensor{q, k, v, out}, []uint64{a.q, a.k, a.v, oa}); sfx != "" && spansWgmma && b.d.info.Hopper() {
		if attnFwdWS {
			l, err := b.wsSpansLaunch(sfx, a, oa, la, scale)
			if err != nil {
				return err
			}
			return b.issue(l)
		}
		nb := (a.tq + wgBM - 1) / wgBM
		return b.issue(launch{name: "k_wg_spans_fwd_" + sfx, gx: uint32(nb * a.hq), gy: 1, gz: 1, bx: wgFwdThreads, by: 1, bz: 1,
			smem: wgSmem("fwd", d), args: new(kargs).u64(oa).u64(la).u64(a.q).u64(a.k).u64(a.v).u64(a.r.qk).
				i32(a.tq).i32(a.tk).i32(a.hq).i32(a.hkv).f32(scale)})
	}
	smem := 4 * (attBK*(d+1) + attBK*d + attFBQ*d)
	return b.issue(launch{name: "k_attn_spans_fwd", gx: uint32((a.tq + attFBQ - 1) / attFBQ), gy: uint32(a.hq), gz: 1,
		bx: 128, by: 1, bz: 1, smem: smem,
		args: new(kargs).u64(oa).dt(out.DType).u64(la).u64(a.q).dt(q.DType).u64(a.k).dt(k.DType).u64(a.v).dt(v.DType).
			u64(a.r.qk).u64(a.r.kq).i32(a.tq).i32(a.tk).i32(a.hq).i32(a.hkv).i32(d).f32(scale)})
}

// AttentionSpansBackward computes the spans' dq [Tq,Hq,D], dk and dv
// [Tk,Hkv,D] from dout and the merged out and lse of the query rows (the
// whole ring's): zero for rows in no span.
func (b *Backend) AttentionSpansBackward(dq, dk, dv, dout, out, lse, q, k, v gpu.Tensor, spans []gpu.Span, scale float32) error {
	const op = "attention spans backward"
	a, err := b.spansCheck(op, q, k, v, spans, scale)
	if err != nil {
		return err
	}
	if err := gpu.CheckSpanAttentionBackward(op, dq, dk, dv, dout, out, lse, a.tq, a.tk, a.hq, a.hkv, a.d); err != nil {
		return err
	}
	as, la, err := b.backwardAddrs(op, dq, dk, dv, dout, out, lse)
	if err != nil {
		return err
	}
	if a.tq == 0 || a.tk == 0 || a.hq == 0 {
		for _, t := range []gpu.Tensor{dq, dk, dv} {
			if err := b.Zero(t); err != nil {
				return err
			}
		}
		return nil
	}
	d := a.d
	if sfx := faSuffix(d, []gpu.Tensor{q, k, v, dout, out, dq, dk, dv}, []uint64{a.q, a.k, a.v, as[3], as[4], as[0], as[1], as[2]}); sfx != "" && spansWgmma && b.d.info.Hopper() {
		rows := a.tq * a.hq
		return b.issue(
			launch{name: "k_wg_spans_pre_" + sfx, gx: uint32((rows*(d/8) + 127) / 128), gy: 1, gz: 1, bx: 128, by: 1, bz: 1,
				args: new(kargs).u64(as[0]).u64(as[3]).u64(as[4]).i32(rows)},
			launch{name: "k_wg_spans_dkv_" + sfx, gx: uint32((a.tk + wgBM - 1) / wgBM * a.hkv), gy: 1, gz: 1, bx: wgDkvThreads, by: 1, bz: 1,
				smem: wgSmem("dkv", d), args: new(kargs).u64(as[1]).u64(as[2]).u64(as[0]).u64(as[3]).u64(la).u64(a.q).u64(a.k).u64(a.v).
					u64(a.r.kq).i32(a.tq).i32(a.tk).i32(a.hq).i32(a.hkv).f32(scale)},
			launch{name: "k_wg_spans_dq_" + sfx, gx: uint32((a.tq + faBM - 1) / faBM * a.hq), gy: 1, gz: 1, bx: 128, by: 1, bz: 1,
				smem: wgSmem("dq", d), args: new(kargs).u64(as[0]).u64(as[3]).u64(la).u64(a.q).u64(a.k).u64(a.v).
					u64(a.r.qk).i32(a.tq).i32(a.tk).i32(a.hq).i32(a.hkv).f32(scale)})
	}
	smemQ := 4 * (2*attBK*(d+1) + 2*attFBQ*d)
	smemK := 4 * (2*attBK*(d+1) + 2*attKBQ*(d+1) + 2*attBK*d + 4*attKBQ)
	common := func(l *kargs) *kargs {
		return l.u64(a.q).dt(q.DType).u64(a.k).dt(k.DType).u64(a.v).dt(v.DType).u64(a.r.qk).u64(a.r.kq).
			i32(a.tq).i32(a.tk).i32(a.hq).i32(a.hkv).i32(d).f32(scale)
	}
	return b.issue(
		launch{name: "k_attn_spans_bwd_dq", gx: uint32((a.tq + attFBQ - 1) / attFBQ), gy: uint32(a.hq), gz: 1, bx: 128, by: 1, bz: 1, smem: smemQ,
			args: common(new(kargs).u64(as[0]).dt(dq.DType).u64(as[3]).dt(dout.DType).u64(as[4]).dt(out.DType).u64(la))},
		launch{name: "k_attn_spans_bwd_dkv", gx: uint32((a.tk + attBK - 1) / attBK), gy: uint32(a.hkv), gz: 1, bx: 128, by: 1, bz: 1, smem: smemK,
			args: common(new(kargs).u64(as[1]).dt(dk.DType).u64(as[2]).dt(dv.DType).u64(as[3]).dt(dout.DType).u64(as[4]).dt(out.DType).u64(la))})
}

// MergeAttention merges a block's attention (bout [T,H,D], blse F32
// [H,T]) into (out, lse) by the log-sum-exp rule; block rows with lse −Inf
// leave theirs as they were.
func (b *Backend) MergeAttention(out, lse, bout, blse gpu.Tensor) error {
	const op = "merge attention"
	t, hn, d, err := gpu.MergeAttentionDims(op, out, lse, bout, blse)
	if err != nil {
		return err
	}
	oa, la, err := b.outLSE(op, "out,lse", out, lse)
	if err != nil {
		return err
	}
	ba, bla, err := b.outLSE(op, "bout,blse", bout, blse)
	if err != nil {
		return err
	}
	n := t * hn
	if n == 0 {
		return nil
	}
	return b.issue(launch{name: "k_attn_merge", gx: uint32((n + 255) / 256), gy: 1, gz: 1, bx: 256, by: 1, bz: 1,
		args: new(kargs).u64(oa).dt(out.DType).u64(la).u64(ba).dt(bout.DType).u64(bla).i32(t).i32(hn).i32(d)})
}
