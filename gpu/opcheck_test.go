package gpu

import (
	"math"
	"strings"
	"testing"
)

// Each shared op check accepts the valid call (returning its dimensions)
// and refuses every kind of mistake with a message naming it.
func TestOpChecks(t *testing.T) {
	m := &fakeMem{1 << 20}
	at := func(off int64, dt DType, shape ...int) Tensor { return view(t, m, off, dt, shape...) }
	const k = 1 << 12 // spacing of distinct operands
	type call func() (dims []int, err error)
	dims := func(ds ...int) []int { return ds }

	// Embedding: table [10,4], ids [3], rows [3,4].
	emb := func(backward bool, table, rows, ids Tensor) call {
		return func() ([]int, error) {
			v, h, n, err := EmbeddingDims("embedding", backward, table, rows, ids)
			return dims(v, h, n), err
		}
	}
	// RMSNorm: x [5,8], dst, rstd [5], w [8].
	rms := func(dst, rstd, x, w Tensor, eps float32) call {
		return func() ([]int, error) {
			tt, h, err := RMSNormDims("rmsnorm", dst, rstd, x, w, eps)
			return dims(tt, h), err
		}
	}
	rmsb := func(dx, dw, dy, x, w, rstd Tensor) call {
		return func() ([]int, error) {
			tt, h, err := RMSNormBackwardDims("rmsnorm backward", dx, dw, dy, x, w, rstd)
			return dims(tt, h), err
		}
	}
	// Fused gate/up with SwiGLU: x [6,8], gate and up [4,8], act [6,4].
	gus := func(act, x, gate, up Tensor) call {
		return func() ([]int, error) {
			tt, kd, n, err := GateUpSwiGLUDims("gate/up swiglu", act, x, gate, up)
			return dims(tt, kd, n), err
		}
	}
	gx, gg, gu, ga := at(20*k, BF16, 6, 8), at(21*k, BF16, 4, 8), at(22*k, BF16, 4, 8), at(23*k, BF16, 6, 4)
	// The down projection's input gradient with SwiGLU's backward: dy
	// [6,8], down [8,4], gate, up, dGate and dUp [6,4].
	dsb := func(dGate, dUp, dy, down, gate, up Tensor) call {
		return func() ([]int, error) {
			tt, kd, n, err := DownSwiGLUBackwardDims("down swiglu backward", dGate, dUp, dy, down, gate, up)
			return dims(tt, kd, n), err
		}
	}
	sy, sw, sg, su, sdg, sdu := at(24*k, BF16, 6, 8), at(25*k, BF16, 8, 4), at(26*k, BF16, 6, 4), at(27*k, BF16, 6, 4),
		at(28*k, BF16, 6, 4), at(29*k, BF16, 6, 4)
	// Attention: q [6,4,8], k, v [6,2,8], cu [3].
	q, kk, v, cu := at(0, BF16, 6, 4, 8), at(k, BF16, 6, 2, 8), at(2*k, BF16, 6, 2, 8), at(3*k, I32, 3)
	attn := func(q, kk, v, cu Tensor, scale float32) call {
		return func() ([]int, error) {
			tt, hq, hkv, d, err := AttentionDims("attention", q, kk, v, cu, scale)
			return dims(tt, hq, hkv, d), err
		}
	}
	out, lse := at(4*k, BF16, 6, 4, 8), at(5*k, F32, 4, 6)
	attnOut := func(out, lse Tensor) call {
		return func() ([]int, error) { return nil, CheckAttention("attention", out, lse, q, kk, v, cu, 6, 4, 8) }
	}
	dq, dk, dv, dout := at(6*k, BF16, 6, 4, 8), at(7*k, BF16, 6, 2, 8), at(8*k, BF16, 6, 2, 8), at(9*k, BF16, 6, 4, 8)
	attnBwd := func(dq, dk, dv Tensor) call {
		return func() ([]int, error) {
			return nil, CheckAttentionBackward("attention backward", dq, dk, dv, dout, out, lse, q, kk, v, cu, 6, 4, 2, 8)
		}
	}
	g, u, o := at(0, BF16, 4, 4), at(k, BF16, 4, 4), at(2*k, BF16, 4, 4)
	// Log-probs: c 4 rows of hd 8, vocabulary 16.
	lh, lw, ltg, llog := at(10*k, BF16, 4, 8), at(11*k, BF16, 16, 8), at(12*k, I32, 4), at(13*k, F32, 4, 16)
	lp := func(logp, entropy Tensor) call {
		return func() ([]int, error) {
			return nil, CheckLogProbs("logprobs", logp, entropy, lh, lw, ltg, llog, 4, entropy.Mem != nil)
		}
	}
	lpb := func(dh, dw, dlogp Tensor) call {
		return func() ([]int, error) {
			return nil, CheckLogProbsBackward("logprobs backward", dh, dw, dlogp, Tensor{}, lh, lw, ltg, llog, 4, 8, 16)
		}
	}
	// QKVSplit and QKVPack: q [6,4,8], k, v [6,2,8], qkv [6,64], bias [64],
	// pos [6].
	qq, qk, qv, qkv := at(14*k, BF16, 6, 4, 8), at(15*k, BF16, 6, 2, 8), at(16*k, BF16, 6, 2, 8), at(17*k, BF16, 6, 64)
	qb, qpos := at(18*k, BF16, 64), at(19*k, I32, 6)
	split := func(pre string, q, kk, v, qkv, bias Tensor) call {
		return func() ([]int, error) {
			tt, hq, hkv, d, err := QKVDims("qkv", pre, q, kk, v, qkv, bias, qpos)
			return dims(tt, hq, hkv, d), err
		}
	}
	tests := []struct {
		name string
		f    call
		want []int
		err  string
	}{
		{"qkv split", split("", qq, qk, qv, qkv, qb), dims(6, 4, 2, 8), ""},
		{"qkv split no bias", split("", qq, qk, qv, qkv, Tensor{}), dims(6, 4, 2, 8), ""},
		{"qkv pack names", split("d", qq, qk, qv, at(17*k, BF16, 6, 63), Tensor{}), nil, "dqkv has shape [6 63], want [6 64]"},
		{"qkv bias shape", split("", qq, qk, qv, qkv, at(18*k, BF16, 48)), nil, "bias has shape [48], want [64]"},
		{"qkv odd head dim", split("", at(14*k, BF16, 6, 4, 7), qk, qv, qkv, Tensor{}), nil, "head dim 7 is odd"},
		{"qkv dtype", split("", qq, qk, at(16*k, F32, 6, 2, 8), qkv, Tensor{}), nil, "v is f32"},
		{"qkv on q", split("", qq, qk, qv, at(14*k+64, BF16, 6, 64), Tensor{}), nil, "qkv must not overlap q"},
		{"qkv k on v", split("", qq, at(16*k, BF16, 6, 2, 8), qv, qkv, Tensor{}), nil, "k must not overlap v"},
		{"gate/up swiglu", gus(ga, gx, gg, gu), dims(6, 8, 4), ""},
		{"gate/up swiglu up shape", gus(ga, gx, gg, at(22*k, BF16, 4, 7)), nil, "up has shape [4 7], want [4 8]"},
		{"gate/up swiglu act shape", gus(at(23*k, BF16, 4, 6), gx, gg, gu), nil, "act has shape [4 6], want [6 4]"},
		{"gate/up swiglu x rank", gus(ga, at(20*k, BF16, 48), gg, gu), nil, "x must have 2 dimensions"},
		{"gate/up swiglu act on x", gus(at(20*k+32, BF16, 6, 4), gx, gg, gu), nil, "act must not overlap x"},
		{"gate/up swiglu act on up", gus(at(22*k, BF16, 6, 4), gx, gg, gu), nil, "act must not overlap up"},
		{"down swiglu backward", dsb(sdg, sdu, sy, sw, sg, su), dims(6, 8, 4), ""},
		{"down swiglu backward down shape", dsb(sdg, sdu, sy, at(25*k, BF16, 7, 4), sg, su), nil, "down has shape [7 4], want [8 4]"},
		{"down swiglu backward up shape", dsb(sdg, sdu, sy, sw, sg, at(27*k, BF16, 4, 6)), nil, "up has shape [4 6], want [6 4]"},
		{"down swiglu backward dUp shape", dsb(sdg, at(29*k, BF16, 6, 8), sy, sw, sg, su), nil, "dUp has shape [6 8], want [6 4]"},
		{"down swiglu backward dy rank", dsb(sdg, sdu, at(24*k, BF16, 48), sw, sg, su), nil, "dy must have 2 dimensions"},
		{"down swiglu backward dGate dtype", dsb(at(28*k, F32, 6, 4), sdu, sy, sw, sg, su), nil, "dGate is f32, want gate's bf16"},
		{"down swiglu backward dGate on gate", dsb(sg, sdu, sy, sw, sg, su), nil, "dGate must not overlap gate"},
		{"down swiglu backward dUp on dy", dsb(sdg, at(24*k+16, BF16, 6, 4), sy, sw, sg, su), nil, "dUp must not overlap dy"},
		{"down swiglu backward dGate on dUp", dsb(sdg, at(28*k+8, BF16, 6, 4), sy, sw, sg, su), nil, "dGate must not overlap dUp"},
		{"embedding", emb(false, at(0, F32, 10, 4), at(k, F32, 3, 4), at(2*k, I32, 3)), dims(10, 4, 3), ""},
		{"embedding backward", emb(true, at(0, F32, 10, 4), at(k, F32, 3, 4), at(2*k, I32, 3)), dims(10, 4, 3), ""},
		{"embedding rows shape", emb(false, at(0, F32, 10, 4), at(k, F32, 3, 5), at(2*k, I32, 3)), nil, "dst has shape [3 5], want [3 4]"},
		{"embedding dst on table", emb(false, at(0, F32, 10, 4), at(16, F32, 3, 4), at(2*k, I32, 3)), nil, "dst must not overlap table"},
		{"embedding dTable on ids", emb(true, at(0, F32, 10, 4), at(k, F32, 3, 4), at(8, I32, 3)), nil, "dTable must not overlap ids"},
		{"embedding ids rank", emb(false, at(0, F32, 10, 4), at(k, F32, 3, 4), at(2*k, I32, 3, 1)), nil, "ids must have 1 dimensions"},

		{"rmsnorm", rms(at(0, BF16, 5, 8), at(k, F32, 5), at(2*k, BF16, 5, 8), at(3*k, BF16, 8), 1e-6), dims(5, 8), ""},
		{"rmsnorm in place", rms(at(2*k, BF16, 5, 8), at(k, F32, 5), at(2*k, BF16, 5, 8), at(3*k, BF16, 8), 1e-6), dims(5, 8), ""},
		{"rmsnorm w shape", rms(at(0, BF16, 5, 8), at(k, F32, 5), at(2*k, BF16, 5, 8), at(3*k, BF16, 7), 1e-6), nil, "w has shape [7], want [8]"},
		{"rmsnorm rstd on dst", rms(at(0, BF16, 5, 8), at(4, F32, 5), at(2*k, BF16, 5, 8), at(3*k, BF16, 8), 1e-6), nil, "rstd must not overlap dst"},
		{"rmsnorm dst shifted on x", rms(at(2*k+2, BF16, 5, 8), at(k, F32, 5), at(2*k, BF16, 5, 8), at(3*k, BF16, 8), 1e-6), nil, "dst"},
		{"rmsnorm eps", rms(at(0, BF16, 5, 8), at(k, F32, 5), at(2*k, BF16, 5, 8), at(3*k, BF16, 8), float32(math.NaN())), nil, "eps"},

		{"rmsnorm backward", rmsb(at(0, BF16, 5, 8), at(k, F32, 8), at(0, BF16, 5, 8), at(2*k, BF16, 5, 8), at(3*k, BF16, 8), at(4*k, F32, 5)), dims(5, 8), ""},
		{"rmsnorm backward no dw", rmsb(at(0, BF16, 5, 8), Tensor{}, at(0, BF16, 5, 8), at(2*k, BF16, 5, 8), at(3*k, BF16, 8), at(4*k, F32, 5)), dims(5, 8), ""},
		{"rmsnorm backward dw on rstd", rmsb(at(0, BF16, 5, 8), at(4*k, F32, 8), at(0, BF16, 5, 8), at(2*k, BF16, 5, 8), at(3*k, BF16, 8), at(4*k, F32, 5)), nil, "dw must not overlap rstd"},
		{"rmsnorm backward dx on x", rmsb(at(2*k, BF16, 5, 8), Tensor{}, at(0, BF16, 5, 8), at(2*k, BF16, 5, 8), at(3*k, BF16, 8), at(4*k, F32, 5)), nil, "dx must not overlap x"},
		{"rmsnorm backward dy shape", rmsb(at(0, BF16, 5, 8), Tensor{}, at(k, BF16, 4, 8), at(2*k, BF16, 5, 8), at(3*k, BF16, 8), at(4*k, F32, 5)), nil, "dy has shape [4 8], want [5 8]"},

		{"swiglu in place", func() ([]int, error) { return nil, CheckSwiGLU("swiglu", g, g, u) }, nil, ""},
		{"swiglu shifted", func() ([]int, error) { return nil, CheckSwiGLU("swiglu", at(4, BF16, 4, 4), g, u) }, nil, "out"},
		{"swiglu backward dGate on dOut", func() ([]int, error) {
			return nil, CheckSwiGLUBackward("swiglu backward", o, at(3*k, BF16, 4, 4), o, g, u)
		}, nil, ""},
		{"swiglu backward dUp on gate", func() ([]int, error) {
			return nil, CheckSwiGLUBackward("swiglu backward", o, g, at(4*k, BF16, 4, 4), g, u)
		}, nil, "dUp must not overlap gate"},

		{"logprobs", lp(at(14*k, F32, 4), at(15*k, F32, 4)), nil, ""},
		{"logprobs logp shape", lp(at(14*k, F32, 5), Tensor{}), nil, "logp has shape [5], want [4]"},
		{"logprobs entropy on h", lp(at(14*k, F32, 4), at(10*k, F32, 4)), nil, "entropy must not overlap h"},
		{"logprobs backward", lpb(at(14*k, BF16, 4, 8), at(16*k, F32, 16, 8), at(15*k, F32, 4)), nil, ""},
		{"logprobs backward dw on dh", lpb(at(14*k, BF16, 4, 8), at(14*k+8, F32, 16, 8), at(15*k, F32, 4)), nil, "dw must not overlap dh"},
		{"logprobs backward dlogp in logits", lpb(at(14*k, BF16, 4, 8), Tensor{}, at(13*k, F32, 4)), nil, "logits must not overlap dlogp"},

		{"addbias", func() ([]int, error) {
			tt, n, err := BiasDims("addbias", false, at(0, BF16, 3, 8), at(k, BF16, 8))
			return dims(tt, n), err
		}, dims(3, 8), ""},
		{"addbias b on y", func() ([]int, error) {
			_, _, err := BiasDims("addbias", false, at(0, BF16, 3, 8), at(4, BF16, 8))
			return nil, err
		}, nil, "y must not overlap b"},
		{"biasgrad db shape", func() ([]int, error) {
			_, _, err := BiasDims("biasgrad", true, at(0, BF16, 3, 8), at(k, F32, 3))
			return nil, err
		}, nil, "db has shape [3], want [8]"},
		{"adamw", func() ([]int, error) {
			return nil, CheckAdamW("adamw", at(0, F32, 4), at(k, F32, 4), at(2*k, F32, 4), at(3*k, F32, 4))
		}, nil, ""},
		{"adamw bf16 grads", func() ([]int, error) {
			return nil, CheckAdamW("adamw", at(0, F32, 4), at(k, BF16, 4), at(2*k, F32, 4), at(3*k, F32, 4))
		}, nil, ""},
		{"adamw i32 grads", func() ([]int, error) {
			return nil, CheckAdamW("adamw", at(0, F32, 4), at(k, I32, 4), at(2*k, F32, 4), at(3*k, F32, 4))
		}, nil, "g must be f32"},
		{"adamw bf16 params", func() ([]int, error) {
			return nil, CheckAdamW("adamw", at(0, BF16, 4), at(k, F32, 4), at(2*k, F32, 4), at(3*k, F32, 4))
		}, nil, "p must be f32"},
		{"adamw v on m", func() ([]int, error) {
			return nil, CheckAdamW("adamw", at(0, F32, 4), at(k, F32, 4), at(2*k, F32, 4), at(2*k+4, F32, 4))
		}, nil, "v overlaps m"},

		{"attention", attn(q, kk, v, cu, 0.125), dims(6, 4, 2, 8), ""},
		{"attention heads", attn(q, at(k, BF16, 6, 3, 8), at(2*k, BF16, 6, 3, 8), cu, 0.125), nil, "4 query heads are not a multiple of 3 kv heads"},
		{"attention v shape", attn(q, kk, at(2*k, BF16, 6, 2, 4), cu, 0.125), nil, "v has shape [6 2 4], want [6 2 8]"},
		{"attention scale", attn(q, kk, v, cu, float32(math.Inf(1))), nil, "scale +Inf is not finite"},
		{"attention outputs", attnOut(out, lse), nil, ""},
		{"attention lse shape", attnOut(out, at(5*k, F32, 6, 4)), nil, "lse has shape [6 4], want [4 6]"},
		{"attention out on k", attnOut(at(k, BF16, 6, 4, 8), lse), nil, "out must not overlap k"},
		{"attention backward", attnBwd(dq, dk, dv), nil, ""},
		{"attention backward dv on dk", attnBwd(dq, dk, at(7*k+32, BF16, 6, 2, 8)), nil, "dv must not overlap dk"},
		{"attention backward dq on lse", attnBwd(at(5*k, BF16, 6, 4, 8), dk, dv), nil, "dq must not overlap lse"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.f()
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i := range tt.want {
				if got[i] != tt.want[i] {
					t.Fatalf("dims %v, want %v", got, tt.want)
				}
			}
		})
	}
}
