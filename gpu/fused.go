package gpu

import (
	"errors"
	"fmt"
)

// ErrNotFused is what a backend's optional fused op returns, wrapped, for
// operands it does not take: the caller then runs the unfused ops. Each
// fused op says how its values differ from theirs (the order of its sums,
// a rounding fewer or other exponentials).
var ErrNotFused = errors.New("not fused for these operands")

// This file holds the reference forms of the fused ops of Backend: each
// backend's fused op must give the values of its steps, which a backend
// without a fused kernel (or a shape its kernel does not take) runs as is.

// AddRMSNormDims checks AddRMSNorm's operands: a, b and sum [T,H] (sum may
// be a or b), and RMSNorm's over sum (RMSNormDims); sum overlaps no other
// operand than a or b. It returns T and H.
func AddRMSNormDims(op string, sum, dst, rstd, a, b, w Tensor, eps float32) (t, h int, err error) {
	if t, h, err = RMSNormDims(op, dst, rstd, sum, w, eps); err != nil {
		return 0, 0, err
	}
	for _, c := range []Named{{"a", a}, {"b", b}} {
		if err := CheckShape(op, c.Name, c.T, t, h); err != nil {
			return 0, 0, err
		}
		if err := CheckAlias(op, "sum", c.Name, sum, c.T); err != nil {
			return 0, 0, err
		}
	}
	if err := CheckNoAliasAll(op, "sum", sum, Named{"dst", dst}, Named{"rstd", rstd}, Named{"w", w}); err != nil {
		return 0, 0, err
	}
	return t, h, nil
}

// AddRMSNormSteps runs AddRMSNorm as its steps: Add(sum, a, b), then
// RMSNorm(dst, rstd, sum, w, eps).
func AddRMSNormSteps(bk Backend, sum, dst, rstd, a, b, w Tensor, eps float32) error {
	if err := bk.Add(sum, a, b); err != nil {
		return err
	}
	return bk.RMSNorm(dst, rstd, sum, w, eps)
}

// RMSNormBackwardAddDims checks RMSNormBackwardAdd's operands: those of
// RMSNormBackward with dx = dy (RMSNormBackwardDims), acc [T,H], and cast
// [T,H] unless it is absent (Mem nil); acc and cast overlap no other
// operand. It returns T and H.
func RMSNormBackwardAddDims(op string, acc, cast, dw, dy, x, w, rstd Tensor) (t, h int, err error) {
	if t, h, err = RMSNormBackwardDims(op, dy, dw, dy, x, w, rstd); err != nil {
		return 0, 0, err
	}
	if err := CheckShape(op, "acc", acc, t, h); err != nil {
		return 0, 0, err
	}
	ins := []Named{{"dw", dw}, {"dy", dy}, {"x", x}, {"w", w}, {"rstd", rstd}}
	if cast.Mem != nil {
		if err := CheckShape(op, "cast", cast, t, h); err != nil {
			return 0, 0, err
		}
		if err := CheckNoAliasAll(op, "cast", cast, append(ins, Named{"acc", acc})...); err != nil {
			return 0, 0, err
		}
	}
	if err := CheckNoAliasAll(op, "acc", acc, ins...); err != nil {
		return 0, 0, err
	}
	return t, h, nil
}

// RMSNormBackwardAddSteps runs RMSNormBackwardAdd as its steps:
// RMSNormBackward(dy, dw, dy, x, w, rstd) (dx over dy, in dy's dtype),
// AddScaled(acc, dy, 1), and Copy(cast, acc) when cast is present.
func RMSNormBackwardAddSteps(bk Backend, acc, cast, dw, dy, x, w, rstd Tensor) error {
	if err := bk.RMSNormBackward(dy, dw, dy, x, w, rstd); err != nil {
		return err
	}
	if err := bk.AddScaled(acc, dy, 1); err != nil {
		return err
	}
	if cast.Mem == nil {
		return nil
	}
	return bk.Copy(cast, acc)
}

// QKVDims checks the operands of QKVSplit and QKVPack: q [T,Hq,D], k and v
// [T,Hkv,D] with D even, qkv [T,(Hq+2·Hkv)·D] overlapping none of them,
// bias [(Hq+2·Hkv)·D] unless it is absent (Mem nil), pos I32 [T]; every
// float operand in q's dtype but bias. Errors name the operands with the
// prefix pre ("d" for QKVPack's). It returns T, Hq, Hkv and D.
func QKVDims(op, pre string, q, k, v, qkv, bias, pos Tensor) (t, hq, hkv, d int, err error) {
	if err := CheckRank(op, pre+"q", q, 3); err != nil {
		return 0, 0, 0, 0, err
	}
	if err := CheckRank(op, pre+"k", k, 3); err != nil {
		return 0, 0, 0, 0, err
	}
	t, hq, d, hkv = q.Shape[0], q.Shape[1], q.Shape[2], k.Shape[1]
	if d%2 != 0 {
		return 0, 0, 0, 0, fmt.Errorf("%s: head dim %d is odd", op, d)
	}
	w := (hq + 2*hkv) * d
	type shaped struct {
		name  string
		t     Tensor
		shape []int
	}
	checks := []shaped{{pre + "k", k, []int{t, hkv, d}}, {pre + "v", v, []int{t, hkv, d}}, {pre + "qkv", qkv, []int{t, w}}, {"pos", pos, []int{t}}}
	if bias.Mem != nil {
		checks = append(checks, shaped{"bias", bias, []int{w}})
	}
	for _, c := range checks {
		if err := CheckShape(op, c.name, c.t, c.shape...); err != nil {
			return 0, 0, 0, 0, err
		}
	}
	if pos.DType != I32 {
		return 0, 0, 0, 0, fmt.Errorf("%s: pos must be i32, got %v", op, pos.DType)
	}
	for _, c := range []Named{{pre + "k", k}, {pre + "v", v}, {pre + "qkv", qkv}} {
		if c.T.DType != q.DType {
			return 0, 0, 0, 0, fmt.Errorf("%s: %s is %v, %sq %v", op, c.Name, c.T.DType, pre, q.DType)
		}
	}
	parts := []Named{{pre + "q", q}, {pre + "k", k}, {pre + "v", v}}
	if err := CheckNoAliasAll(op, pre+"qkv", qkv, append(parts, Named{"bias", bias}, Named{"pos", pos})...); err != nil {
		return 0, 0, 0, 0, err
	}
	for i, a := range parts {
		if err := CheckNoAliasAll(op, a.Name, a.T, append(parts[i+1:], Named{"bias", bias}, Named{"pos", pos})...); err != nil {
			return 0, 0, 0, 0, err
		}
	}
	return t, hq, hkv, d, nil
}

// qkvParts returns the column ranges of q, k and v in a fused row.
func qkvParts(hq, hkv, d int) [3][2]int {
	qd, kd := hq*d, hkv*d
	return [3][2]int{{0, qd}, {qd, qd + kd}, {qd + kd, qd + 2*kd}}
}

// QKVSplitSteps runs QKVSplit as its steps: each part's columns copied out
// of qkv (ColumnCopy), its bias slice added (AddBias), and q and k rotated
// (RoPE).
func QKVSplitSteps(bk Backend, cp ColumnCopier, q, k, v, qkv, bias, pos Tensor, theta float64, scaling *RoPEScaling) error {
	t, hq, hkv, d, err := QKVDims("qkv split", "", q, k, v, qkv, bias, pos)
	if err != nil {
		return err
	}
	for i, part := range []Tensor{q, k, v} {
		cols := qkvParts(hq, hkv, d)[i]
		dst, err := part.Reshape(t, cols[1]-cols[0])
		if err != nil {
			return err
		}
		if err := cp.CopyColumns(dst, 0, qkv, cols[0], cols[1]-cols[0]); err != nil {
			return err
		}
		if bias.Mem != nil {
			bs, err := bias.Flat(cols[0], cols[1])
			if err != nil {
				return err
			}
			if err := bk.AddBias(dst, bs); err != nil {
				return err
			}
		}
		if i < 2 {
			if err := bk.RoPE(part, pos, theta, scaling); err != nil {
				return err
			}
		}
	}
	return nil
}

// QKVPackSteps runs QKVPack as its steps: dq and dk rotated back in place
// (RoPEBackward), then dq, dk and dv copied into their columns of dqkv.
func QKVPackSteps(bk Backend, cp ColumnCopier, dqkv, dq, dk, dv, pos Tensor, theta float64, scaling *RoPEScaling) error {
	t, hq, hkv, d, err := QKVDims("qkv pack", "d", dq, dk, dv, dqkv, Tensor{}, pos)
	if err != nil {
		return err
	}
	for i, part := range []Tensor{dq, dk, dv} {
		if i < 2 {
			if err := bk.RoPEBackward(part, pos, theta, scaling); err != nil {
				return err
			}
		}
		cols := qkvParts(hq, hkv, d)[i]
		src, err := part.Reshape(t, cols[1]-cols[0])
		if err != nil {
			return err
		}
		if err := cp.CopyColumns(dqkv, cols[0], src, 0, cols[1]-cols[0]); err != nil {
			return err
		}
	}
	return nil
}

// ColumnCopier copies blocks of columns between row-major matrices, which
// the steps of QKVSplit and QKVPack need and Backend does not offer.
type ColumnCopier interface {
	// CopyColumns copies columns [srcCol, srcCol+n) of src [T,*] into
	// columns [dstCol, dstCol+n) of dst [T,*], in dst's dtype.
	CopyColumns(dst Tensor, dstCol int, src Tensor, srcCol, n int) error
}

// GateUpSwiGLUDims checks the operands of a fused gate/up product with
// SwiGLU (act = SwiGLU(x·gateᵀ, x·upᵀ)): x [T,K], gate and up [N,K], act
// [T,N], act overlapping none of the others (the product reads x and the
// weights while it writes act). It returns T, K and N.
func GateUpSwiGLUDims(op string, act, x, gate, up Tensor) (t, k, n int, err error) {
	if err := CheckRank(op, "x", x, 2); err != nil {
		return 0, 0, 0, err
	}
	if err := CheckRank(op, "gate", gate, 2); err != nil {
		return 0, 0, 0, err
	}
	t, k, n = x.Shape[0], x.Shape[1], gate.Shape[0]
	for _, c := range []struct {
		name string
		t    Tensor
		want []int
	}{{"gate", gate, []int{n, k}}, {"up", up, []int{n, k}}, {"act", act, []int{t, n}}} {
		if err := CheckShape(op, c.name, c.t, c.want...); err != nil {
			return 0, 0, 0, err
		}
	}
	if err := CheckNoAliasAll(op, "act", act, Named{"x", x}, Named{"gate", gate}, Named{"up", up}); err != nil {
		return 0, 0, 0, err
	}
	return t, k, n, nil
}

// GateUpSwiGLUSteps runs the fused gate/up product with SwiGLU as its
// steps: the two products into scratch of bk's, in act's dtype, then
// SwiGLU into act.
func GateUpSwiGLUSteps(bk Backend, act, x, gate, up Tensor) error {
	t, _, n, err := GateUpSwiGLUDims("gate/up swiglu", act, x, gate, up)
	if err != nil {
		return err
	}
	mem, err := bk.Alloc(int64(2 * t * n * act.DType.Size()))
	if err != nil {
		return err
	}
	defer bk.Free(mem)
	g, err := NewTensor(mem, 0, act.DType, t, n)
	if err != nil {
		return err
	}
	u, err := NewTensor(mem, g.Bytes(), act.DType, t, n)
	if err != nil {
		return err
	}
	return GateUpSwiGLUKeepSteps(bk, act, g, u, x, gate, up)
}

// GateUpSwiGLUKeepDims checks the operands of a fused gate/up product with
// SwiGLU that also keeps the two products (gOut = x·gateᵀ and uOut =
// x·upᵀ, rounded to act's dtype, for the backward): those of
// GateUpSwiGLUDims, with gOut and uOut [T,N] in act's dtype, the three
// outputs overlapping each other and the inputs nowhere. It returns T, K
// and N.
func GateUpSwiGLUKeepDims(op string, act, gOut, uOut, x, gate, up Tensor) (t, k, n int, err error) {
	if t, k, n, err = GateUpSwiGLUDims(op, act, x, gate, up); err != nil {
		return 0, 0, 0, err
	}
	ins := []Named{{"x", x}, {"gate", gate}, {"up", up}}
	for _, o := range []Named{{"gate_out", gOut}, {"up_out", uOut}} {
		if err := CheckShape(op, o.Name, o.T, t, n); err != nil {
			return 0, 0, 0, err
		}
		if o.T.DType != act.DType {
			return 0, 0, 0, fmt.Errorf("%s: %s is %v, want act's %v", op, o.Name, o.T.DType, act.DType)
		}
		if err := CheckNoAliasAll(op, o.Name, o.T, append(ins, Named{"act", act})...); err != nil {
			return 0, 0, 0, err
		}
	}
	if err := CheckNoAliasAll(op, "gate_out", gOut, Named{"up_out", uOut}); err != nil {
		return 0, 0, 0, err
	}
	return t, k, n, nil
}

// GateUpSwiGLUKeepSteps runs the fused gate/up product with SwiGLU that
// keeps its products as its steps: the two products into gOut and uOut,
// then SwiGLU of them into act.
func GateUpSwiGLUKeepSteps(bk Backend, act, gOut, uOut, x, gate, up Tensor) error {
	if _, _, _, err := GateUpSwiGLUKeepDims("gate/up swiglu keep", act, gOut, uOut, x, gate, up); err != nil {
		return err
	}
	if err := bk.Gemm(gOut, x, gate, false, true, 1, 0); err != nil {
		return err
	}
	if err := bk.Gemm(uOut, x, up, false, true, 1, 0); err != nil {
		return err
	}
	return bk.SwiGLU(act, gOut, uOut)
}

// DownSwiGLUBackwardDims checks the operands of the down projection's
// input gradient with SwiGLU's backward as one op (dact = dy·down, then
// dGate and dUp = SwiGLU's backward of dact at gate and up): dy [T,K], down
// [K,N], gate, up, dGate and dUp [T,N], dGate and dUp in gate's dtype and
// overlapping each other and the inputs nowhere (the product reads dy and
// down while other rows' outputs are written). It returns T, K and N.
func DownSwiGLUBackwardDims(op string, dGate, dUp, dy, down, gate, up Tensor) (t, k, n int, err error) {
	if err := CheckRank(op, "dy", dy, 2); err != nil {
		return 0, 0, 0, err
	}
	if err := CheckRank(op, "down", down, 2); err != nil {
		return 0, 0, 0, err
	}
	t, k, n = dy.Shape[0], dy.Shape[1], down.Shape[1]
	for _, c := range []struct {
		name string
		t    Tensor
		want []int
	}{{"down", down, []int{k, n}}, {"gate", gate, []int{t, n}}, {"up", up, []int{t, n}},
		{"dGate", dGate, []int{t, n}}, {"dUp", dUp, []int{t, n}}} {
		if err := CheckShape(op, c.name, c.t, c.want...); err != nil {
			return 0, 0, 0, err
		}
	}
	ins := []Named{{"dy", dy}, {"down", down}, {"gate", gate}, {"up", up}}
	for _, o := range []Named{{"dGate", dGate}, {"dUp", dUp}} {
		if o.T.DType != gate.DType {
			return 0, 0, 0, fmt.Errorf("%s: %s is %v, want gate's %v", op, o.Name, o.T.DType, gate.DType)
		}
		if err := CheckNoAliasAll(op, o.Name, o.T, ins...); err != nil {
			return 0, 0, 0, err
		}
	}
	if err := CheckNoAliasAll(op, "dGate", dGate, Named{"dUp", dUp}); err != nil {
		return 0, 0, 0, err
	}
	return t, k, n, nil
}

// DownSwiGLUBackwardSteps runs the down projection's input gradient with
// SwiGLU's backward as its steps: dact = dy·down into scratch of bk's, in
// gate's dtype, then SwiGLUBackward from it into dGate and dUp.
func DownSwiGLUBackwardSteps(bk Backend, dGate, dUp, dy, down, gate, up Tensor) error {
	t, _, n, err := DownSwiGLUBackwardDims("down swiglu backward", dGate, dUp, dy, down, gate, up)
	if err != nil {
		return err
	}
	mem, err := bk.Alloc(int64(t * n * gate.DType.Size()))
	if err != nil {
		return err
	}
	defer bk.Free(mem)
	dact, err := NewTensor(mem, 0, gate.DType, t, n)
	if err != nil {
		return err
	}
	if err := bk.Gemm(dact, dy, down, false, false, 1, 0); err != nil {
		return err
	}
	return bk.SwiGLUBackward(dGate, dUp, dact, gate, up)
}
