package gpu

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
