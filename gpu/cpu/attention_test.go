package cpu

import (
	"math"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// attnRef is causal varlen GQA attention in float64: it returns out
// [T,Hq,D] and lse [Hq,T].
func attnRef(q, k, v []float64, cu []int32, hq, hkv, d int, scale float64) (out, lse []float64) {
	t := int(cu[len(cu)-1])
	out, lse = make([]float64, t*hq*d), make([]float64, hq*t)
	g := hq / hkv
	for s := 0; s+1 < len(cu); s++ {
		st, en := int(cu[s]), int(cu[s+1])
		for h := range hq {
			kh := h / g
			for i := st; i < en; i++ {
				qi := q[(i*hq+h)*d : (i*hq+h+1)*d]
				sc := make([]float64, i+1-st)
				m := math.Inf(-1)
				for j := st; j <= i; j++ {
					sc[j-st] = scale * dot64(qi, k[(j*hkv+kh)*d:(j*hkv+kh+1)*d])
					m = math.Max(m, sc[j-st])
				}
				z := 0.0
				for _, x := range sc {
					z += math.Exp(x - m)
				}
				l := m + math.Log(z)
				lse[h*t+i] = l
				o := out[(i*hq+h)*d : (i*hq+h+1)*d]
				for j := st; j <= i; j++ {
					p := math.Exp(sc[j-st] - l)
					for x := range d {
						o[x] += p * v[(j*hkv+kh)*d+x]
					}
				}
			}
		}
	}
	return out, lse
}

// attnRefBackward is the textbook attention backward in float64.
func attnRefBackward(dout, q, k, v []float64, cu []int32, hq, hkv, d int, scale float64) (dq, dk, dv []float64) {
	t := int(cu[len(cu)-1])
	dq, dk, dv = make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
	_, lse := attnRef(q, k, v, cu, hq, hkv, d, scale)
	g := hq / hkv
	for s := 0; s+1 < len(cu); s++ {
		st, en := int(cu[s]), int(cu[s+1])
		for h := range hq {
			kh := h / g
			for i := st; i < en; i++ {
				qo := (i*hq + h) * d
				n := i + 1 - st
				p, dp := make([]float64, n), make([]float64, n)
				delta := 0.0
				for j := st; j <= i; j++ {
					ko := (j*hkv + kh) * d
					p[j-st] = math.Exp(scale*dot64(q[qo:qo+d], k[ko:ko+d]) - lse[h*t+i])
					dp[j-st] = dot64(dout[qo:qo+d], v[ko:ko+d])
					delta += p[j-st] * dp[j-st]
				}
				for j := st; j <= i; j++ {
					ko := (j*hkv + kh) * d
					ds := p[j-st] * (dp[j-st] - delta)
					for x := range d {
						dq[qo+x] += scale * ds * k[ko+x]
						dk[ko+x] += scale * ds * q[qo+x]
						dv[ko+x] += p[j-st] * dout[qo+x]
					}
				}
			}
		}
	}
	return dq, dk, dv
}

type attnCase struct {
	lens          []int
	hq, hkv, d    int
	scale         float64
	qdt           gpu.DType
	atol, rtol    float64
	checkBackward bool
}

func (c attnCase) cu() []int32 {
	cu := []int32{0}
	for _, l := range c.lens {
		cu = append(cu, cu[len(cu)-1]+int32(l))
	}
	return cu
}

func TestAttention(t *testing.T) {
	tests := []struct {
		name string
		c    attnCase
	}{
		// Three packed sequences, one longer than a tile, GQA 4:2.
		{"packed gqa f32", attnCase{lens: []int{5, 40, 17}, hq: 4, hkv: 2, d: 8, scale: 1 / math.Sqrt(8), qdt: f32, atol: 1e-5, rtol: 1e-4, checkBackward: true}},
		{"mha single", attnCase{lens: []int{70}, hq: 2, hkv: 2, d: 4, scale: 0.5, qdt: f32, atol: 1e-5, rtol: 1e-4, checkBackward: true}},
		{"mqa with empty sequence", attnCase{lens: []int{3, 0, 1, 9}, hq: 3, hkv: 1, d: 6, scale: 0.4, qdt: f32, atol: 1e-5, rtol: 1e-4, checkBackward: true}},
		{"bf16", attnCase{lens: []int{7, 33, 2}, hq: 4, hkv: 2, d: 16, scale: 0.25, qdt: bf16, atol: 2e-2, rtol: 2e-2, checkBackward: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			e := newEnv(t)
			r := rng()
			cu := c.cu()
			tt := int(cu[len(cu)-1])
			qv := randn(r, tt*c.hq*c.d, 1, c.qdt)
			kv := randn(r, tt*c.hkv*c.d, 1, c.qdt)
			vv := randn(r, tt*c.hkv*c.d, 1, c.qdt)
			q, k, v := e.up(c.qdt, qv, tt, c.hq, c.d), e.up(c.qdt, kv, tt, c.hkv, c.d), e.up(c.qdt, vv, tt, c.hkv, c.d)
			cut := e.ids(cu)
			out, lse := e.tensor(c.qdt, tt, c.hq, c.d), e.tensor(f32, c.hq, tt)
			if err := e.b.Attention(out, lse, q, k, v, cut, float32(c.scale)); err != nil {
				t.Fatal(err)
			}
			wantO, wantL := attnRef(f64(qv), f64(kv), f64(vv), cu, c.hq, c.hkv, c.d, c.scale)
			closeTo(t, "out", e.down(out), wantO, c.atol, c.rtol)
			closeTo(t, "lse", e.down(lse), wantL, 1e-5, 1e-5)
			if !c.checkBackward {
				return
			}
			dov := randn(r, tt*c.hq*c.d, 1, c.qdt)
			dout := e.up(c.qdt, dov, tt, c.hq, c.d)
			dq, dk, dv := e.tensor(c.qdt, tt, c.hq, c.d), e.tensor(c.qdt, tt, c.hkv, c.d), e.tensor(c.qdt, tt, c.hkv, c.d)
			if err := e.b.AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, cut, float32(c.scale)); err != nil {
				t.Fatal(err)
			}
			wq, wk, wv := attnRefBackward(f64(dov), f64(qv), f64(kv), f64(vv), cu, c.hq, c.hkv, c.d, c.scale)
			closeTo(t, "dq", e.down(dq), wq, c.atol*10, c.rtol*10)
			closeTo(t, "dk", e.down(dk), wk, c.atol*10, c.rtol*10)
			closeTo(t, "dv", e.down(dv), wv, c.atol*10, c.rtol*10)
		})
	}
}

// TestAttentionBackwardFiniteDiff checks the backward against finite
// differences of L = Σ dout·attention(q,k,v) on a tiny packed GQA case.
func TestAttentionBackwardFiniteDiff(t *testing.T) {
	c := attnCase{lens: []int{2, 3, 1}, hq: 4, hkv: 2, d: 3, scale: 0.7}
	cu := c.cu()
	tt := int(cu[len(cu)-1])
	e := newEnv(t)
	r := rng()
	qv, kv, vv := randn(r, tt*c.hq*c.d, 1, f32), randn(r, tt*c.hkv*c.d, 1, f32), randn(r, tt*c.hkv*c.d, 1, f32)
	dov := randn(r, tt*c.hq*c.d, 1, f32)
	q, k, v := e.up(f32, qv, tt, c.hq, c.d), e.up(f32, kv, tt, c.hkv, c.d), e.up(f32, vv, tt, c.hkv, c.d)
	cut := e.ids(cu)
	out, lse := e.tensor(f32, tt, c.hq, c.d), e.tensor(f32, c.hq, tt)
	if err := e.b.Attention(out, lse, q, k, v, cut, float32(c.scale)); err != nil {
		t.Fatal(err)
	}
	dq, dk, dv := e.tensor(f32, tt, c.hq, c.d), e.tensor(f32, tt, c.hkv, c.d), e.tensor(f32, tt, c.hkv, c.d)
	if err := e.b.AttentionBackward(dq, dk, dv, e.up(f32, dov, tt, c.hq, c.d), out, lse, q, k, v, cut, float32(c.scale)); err != nil {
		t.Fatal(err)
	}
	q64, k64, v64, do64 := f64(qv), f64(kv), f64(vv), f64(dov)
	loss := func() float64 {
		o, _ := attnRef(q64, k64, v64, cu, c.hq, c.hkv, c.d, c.scale)
		return dot64(do64, o)
	}
	const h = 1e-6
	closeTo(t, "dq", e.down(dq), numGrad(q64, h, func([]float64) float64 { return loss() }), 1e-5, 1e-4)
	closeTo(t, "dk", e.down(dk), numGrad(k64, h, func([]float64) float64 { return loss() }), 1e-5, 1e-4)
	closeTo(t, "dv", e.down(dv), numGrad(v64, h, func([]float64) float64 { return loss() }), 1e-5, 1e-4)
}

func TestAttentionErrors(t *testing.T) {
	e := newEnv(t)
	const tt, d = 6, 4
	q, k, v := e.tensor(f32, tt, 4, d), e.tensor(f32, tt, 2, d), e.tensor(f32, tt, 2, d)
	out, lse := e.tensor(f32, tt, 4, d), e.tensor(f32, 4, tt)
	cu := e.ids([]int32{0, 2, 6})
	tests := []struct {
		name                  string
		out, lse, q, k, v, cu gpu.Tensor
	}{
		{"heads not multiple", out, lse, q, e.tensor(f32, tt, 3, d), e.tensor(f32, tt, 3, d), cu},
		{"v shape", out, lse, q, k, e.tensor(f32, tt, 2, d+1), cu},
		{"cu end", out, lse, q, k, v, e.ids([]int32{0, 2, 5})},
		{"cu start", out, lse, q, k, v, e.ids([]int32{1, 6})},
		{"cu decreasing", out, lse, q, k, v, e.ids([]int32{0, 4, 3, 6})},
		{"cu dtype", out, lse, q, k, v, e.tensor(f32, 3)},
		{"lse shape", out, e.tensor(f32, tt, 4), q, k, v, cu},
		{"lse dtype", out, e.tensor(bf16, 4, tt), q, k, v, cu},
		{"out aliases q", q, lse, q, k, v, cu},
	}
	for _, tc := range tests {
		if err := e.b.Attention(tc.out, tc.lse, tc.q, tc.k, tc.v, tc.cu, 0.5); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	if err := e.b.AttentionBackward(e.tensor(f32, tt, 4, d), k, e.tensor(f32, tt, 2, d), out, out, lse, q, k, v, cu, 0.5); err == nil {
		t.Error("backward: dk aliasing k accepted")
	}
	if err := e.b.AttentionBackward(e.tensor(f32, tt, 2, d), e.tensor(f32, tt, 2, d), e.tensor(f32, tt, 2, d), out, out, lse, q, k, v, cu, 0.5); err == nil {
		t.Error("backward: dq shape mismatch accepted")
	}
}
