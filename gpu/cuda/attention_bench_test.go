//go:build cgo

package cuda

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// attnShape is one packed batch of equal-length causal sequences for
// BenchmarkAttention: seqs sequences of n tokens, hq query and hkv kv
// heads of head dim d.
type attnShape struct{ seqs, n, hq, hkv, d int }

// defaultAttnShapes are BenchmarkAttention's shapes without
// RLPIPE_BENCH_ATTN: 16384 tokens as 8, 2 and 1 sequences at the 3B's
// heads (16/2 of 128), then 8 × 2048 at the 1.5B's (12/2 of 128) and the
// 0.5B's (14/2 of 64).
const defaultAttnShapes = "8x2048/16/2/128 2x8192/16/2/128 1x16384/16/2/128 8x2048/12/2/128 8x2048/14/2/64"

// parseAttnShapes reads shapes written SEQSxN/HQ/HKV/D, separated by
// spaces.
func parseAttnShapes(s string) ([]attnShape, error) {
	var out []attnShape
	for _, f := range strings.Fields(s) {
		var a attnShape
		sn, rest, ok1 := strings.Cut(f, "/")
		seqs, n, ok2 := strings.Cut(sn, "x")
		parts := strings.Split(rest, "/")
		if !ok1 || !ok2 || len(parts) != 3 {
			return nil, fmt.Errorf("attention shape %q: want SEQSxN/HQ/HKV/D", f)
		}
		vals := []*int{&a.seqs, &a.n, &a.hq, &a.hkv, &a.d}
		for i, txt := range append([]string{seqs, n}, parts...) {
			v, err := strconv.Atoi(txt)
			if err != nil || v <= 0 {
				return nil, fmt.Errorf("attention shape %q: %q is not a positive integer", f, txt)
			}
			*vals[i] = v
		}
		if a.hq%a.hkv != 0 {
			return nil, fmt.Errorf("attention shape %q: %d query heads are not a multiple of %d kv heads", f, a.hq, a.hkv)
		}
		out = append(out, a)
	}
	return out, nil
}

// fwdFlops is the forward's FLOPs by FlashAttention's count for causal
// attention: two products of the n(n+1)/2 visible scores of each
// sequence and head, 2 FLOPs a multiply-add. The backward's are 2.5 times
// these (five products to the forward's two).
func (a attnShape) fwdFlops() float64 {
	return float64(a.seqs) * 2 * 2 * float64(a.n) * float64(a.n+1) / 2 * float64(a.d*a.hq)
}

func (a attnShape) String() string {
	return fmt.Sprintf("%dx%d h%d/%d d%d", a.seqs, a.n, a.hq, a.hkv, a.d)
}

// BenchmarkAttention times the causal varlen attention forward and
// backward (bf16, the kernels Backend.Attention and AttentionBackward
// pick on this GPU) on packed batches of equal-length sequences,
// reporting TFLOP/s by FlashAttention's count (fwdFlops; 2.5 times it for
// the backward). bench/attn_peer.py times PyTorch's scaled_dot_product_attention
// on the same shapes, and bench/attn_peer_device.sh runs both in one call:
//
//	RLPIPE_BENCH_ATTN="2x8192/16/2/128" go test -run '^$' -bench Attention -benchtime 20x ./gpu/cuda
//
// RLPIPE_BENCH_ATTN lists the shapes, SEQSxN/HQ/HKV/D separated by spaces
// (defaultAttnShapes without it). Without a driver it skips.
func BenchmarkAttention(bb *testing.B) {
	spec := os.Getenv("RLPIPE_BENCH_ATTN")
	if spec == "" {
		spec = defaultAttnShapes
	}
	shapes, err := parseAttnShapes(spec)
	if err != nil {
		bb.Fatal(err)
	}
	b := backend(bb)
	for _, a := range shapes {
		t := a.seqs * a.n
		var need int64
		for _, heads := range []int{a.hq, a.hkv, a.hkv, a.hq, a.hq, a.hq, a.hkv, a.hkv} {
			need += int64(t*heads*a.d)*2 + 256
		}
		need += int64(a.hq*t)*4 + int64(a.seqs+1)*4 + 1024
		mem, err := b.Alloc(need)
		if err != nil {
			bb.Fatal(err)
		}
		var off int64
		ten := func(dt gpu.DType, shape ...int) gpu.Tensor { return benchTensor(bb, mem, &off, dt, shape...) }
		q, k, v := ten(gpu.BF16, t, a.hq, a.d), ten(gpu.BF16, t, a.hkv, a.d), ten(gpu.BF16, t, a.hkv, a.d)
		o, dout := ten(gpu.BF16, t, a.hq, a.d), ten(gpu.BF16, t, a.hq, a.d)
		dq, dk, dv := ten(gpu.BF16, t, a.hq, a.d), ten(gpu.BF16, t, a.hkv, a.d), ten(gpu.BF16, t, a.hkv, a.d)
		lse := ten(gpu.F32, a.hq, t)
		cu := ten(gpu.I32, a.seqs+1)
		cuv := make([]int32, a.seqs+1)
		for i := range cuv {
			cuv[i] = int32(i * a.n)
		}
		r := scrambled(t*a.hq*a.d, 1)
		for _, up := range []struct {
			x gpu.Tensor
			v []float32
		}{{q, r}, {k, r[:t*a.hkv*a.d]}, {v, r[t*a.hkv*a.d : 2*t*a.hkv*a.d]}, {dout, r[len(r)-t*a.hq*a.d:]}} {
			if err := b.Upload(up.x, up.v); err != nil {
				bb.Fatal(err)
			}
		}
		if err := b.UploadI32(cu, cuv); err != nil {
			bb.Fatal(err)
		}
		scale := float32(1 / math.Sqrt(float64(a.d)))
		fwd := func() error { return b.Attention(o, lse, q, k, v, cu, scale) }
		// The forward's out and lse feed the backward.
		if err := fwd(); err != nil {
			bb.Fatal(err)
		}
		bwd := func() error { return b.AttentionBackward(dq, dk, dv, dout, o, lse, q, k, v, cu, scale) }
		timeOp(bb, b, "fwd "+a.String(), a.fwdFlops(), 0, fwd)
		timeOp(bb, b, "bwd "+a.String(), 2.5*a.fwdFlops(), 0, bwd)

		if err := b.Sync(); err != nil {
			bb.Fatal(err)
		}
		b.Free(mem)
	}
}

func TestParseAttnShapes(t *testing.T) {
	tests := []struct {
		in   string
		want []attnShape
		err  string
	}{
		{"8x2048/16/2/128", []attnShape{{8, 2048, 16, 2, 128}}, ""},
		{" 2x8192/12/2/128  1x16384/14/2/64 ", []attnShape{{2, 8192, 12, 2, 128}, {1, 16384, 14, 2, 64}}, ""},
		{"8x2048/16/2", nil, "want SEQSxN/HQ/HKV/D"},
		{"8-2048/16/2/128", nil, "want SEQSxN/HQ/HKV/D"},
		{"8x0/16/2/128", nil, `"0" is not a positive integer`},
		{"8x2048/16/3/128", nil, "not a multiple of 3 kv heads"},
	}
	for _, tc := range tests {
		got, err := parseAttnShapes(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseAttnShapes(%q) error %v, want one containing %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("parseAttnShapes(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	if _, err := parseAttnShapes(defaultAttnShapes); err != nil {
		t.Errorf("defaultAttnShapes: %v", err)
	}
	if got, want := (attnShape{1, 3, 1, 1, 1}).fwdFlops(), 4.0*6; got != want {
		t.Errorf("fwdFlops = %v, want %v", got, want)
	}
}
