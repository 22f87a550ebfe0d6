package gpu

import (
	"fmt"
	"math"
)

// RoPEInvFreq returns the headDim/2 rotary inverse frequencies as HF
// transformers computes them in float32: the default
// 1/(theta^(2i/headDim)), divided by Factor for "linear", and adjusted by
// _compute_llama3_parameters for "llama3" (frequencies whose wavelength
// exceeds original_max_position_embeddings/low_freq_factor are divided by
// factor, those shorter than .../high_freq_factor are kept, and the band in
// between is interpolated smoothly). The float32 operations follow torch's
// order, so the result matches HF bit for bit up to the last-ulp accuracy of
// pow.
func RoPEInvFreq(headDim int, theta float64, s *RoPEScaling) ([]float32, error) {
	if headDim <= 0 || headDim%2 != 0 {
		return nil, fmt.Errorf("rope: head dim %d must be positive and even", headDim)
	}
	if !(theta > 0) || math.IsInf(theta, 0) {
		return nil, fmt.Errorf("rope: theta %v must be positive", theta)
	}
	half := headDim / 2
	inv := make([]float32, half)
	base := float64(float32(theta))
	for i := range inv {
		e := float32(2*i) / float32(headDim)
		p := float32(math.Pow(base, float64(e)))
		inv[i] = 1 / p
	}
	typ := ""
	if s != nil {
		typ = s.Type
	}
	switch typ {
	case "", "default":
		return inv, nil
	case "linear":
		if !(s.Factor > 0) {
			return nil, fmt.Errorf("rope: linear scaling factor %v must be positive", s.Factor)
		}
		f := float32(s.Factor)
		for i := range inv {
			inv[i] /= f
		}
		return inv, nil
	case "llama3":
		return llama3InvFreq(inv, s)
	}
	return nil, fmt.Errorf("rope: scaling type %q is not supported", typ)
}

func llama3InvFreq(inv []float32, s *RoPEScaling) ([]float32, error) {
	if !(s.Factor > 0) || !(s.LowFreqFactor > 0) || !(s.HighFreqFactor > s.LowFreqFactor) || s.OriginalMaxPositionEmbeddings <= 0 {
		return nil, fmt.Errorf("rope: bad llama3 scaling (factor %v, low_freq_factor %v, high_freq_factor %v, original_max_position_embeddings %d)",
			s.Factor, s.LowFreqFactor, s.HighFreqFactor, s.OriginalMaxPositionEmbeddings)
	}
	old := float64(s.OriginalMaxPositionEmbeddings)
	lowWavelen := float32(old / s.LowFreqFactor)
	highWavelen := float32(old / s.HighFreqFactor)
	factor := float32(s.Factor)
	twoPi := float32(2 * math.Pi)
	oldF := float32(old)
	lowF := float32(s.LowFreqFactor)
	band := float32(s.HighFreqFactor - s.LowFreqFactor)
	out := make([]float32, len(inv))
	for i, f := range inv {
		// torch evaluates scalar/tensor as reciprocal(tensor)*scalar; the
		// float32 conversions keep each product rounded (no fused multiply-add).
		wavelen := float32(1/f) * twoPi
		l := f
		if wavelen > lowWavelen {
			l = f / factor
		}
		smooth := (float32(float32(1/wavelen)*oldF) - lowF) / band
		smoothed := float32(float32((1-smooth)*l)/factor) + float32(smooth*l)
		if !(wavelen < highWavelen) && !(wavelen > lowWavelen) {
			l = smoothed
		}
		out[i] = l
	}
	return out, nil
}
