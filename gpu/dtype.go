package gpu

import (
	"fmt"
	"math"
)

// DType is the element type of a tensor.
type DType uint8

// The element types a backend supports. The zero DType is invalid, so that a
// zero Tensor is recognisably unset.
const (
	F32  DType = iota + 1 // IEEE-754 binary32.
	BF16                  // bfloat16: the upper 16 bits of a binary32.
	F16                   // IEEE-754 binary16.
	I32                   // Two's-complement 32-bit integer.
)

// Size returns the size of one element in bytes, or 0 for an invalid DType.
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case BF16, F16:
		return 2
	}
	return 0
}

// Valid reports whether d is one of the defined element types.
func (d DType) Valid() bool { return d.Size() != 0 }

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool { return d == F32 || d == BF16 || d == F16 }

// String returns the lower-case name of the type as used in configs and
// safetensors headers ("f32", "bf16", "f16", "i32").
func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	case F16:
		return "f16"
	case I32:
		return "i32"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// ParseDType parses a type name. It accepts the names returned by String as
// well as the common long forms ("float32", "bfloat16", "float16", "int32")
// and the safetensors spellings ("F32", "BF16", "F16", "I32").
func ParseDType(s string) (DType, error) {
	switch s {
	case "f32", "F32", "float32", "fp32", "float":
		return F32, nil
	case "bf16", "BF16", "bfloat16":
		return BF16, nil
	case "f16", "F16", "float16", "fp16", "half":
		return F16, nil
	case "i32", "I32", "int32":
		return I32, nil
	}
	return 0, fmt.Errorf("unknown dtype %q", s)
}

// BF16FromF32 converts f to bfloat16 bits with round-to-nearest-even. NaN
// stays NaN (quiet, sign kept), values beyond the bfloat16 range become
// infinities.
func BF16FromF32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: truncate and force the quiet bit.
		return uint16(b>>16) | 0x0040
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// F32FromBF16 converts bfloat16 bits to float32 (exact).
func F32FromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F16FromF32 converts f to IEEE binary16 bits with round-to-nearest-even,
// producing subnormals where needed. NaN stays NaN (quiet, sign kept), values
// beyond the binary16 range become infinities.
func F16FromF32(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00 | uint16(man>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign
		}
		m := man | 0x800000
		shift := uint(14 - e)
		h := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // May carry into the exponent, up to infinity: both are correct.
	}
	return sign | uint16(h)
}

// F32FromF16 converts IEEE binary16 bits to float32 (exact).
func F32FromF16(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0:
		v := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			v = -v
		}
		return v
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}

// Round returns v rounded to the precision of d (identity for F32 and I32).
func Round(d DType, v float32) float32 {
	switch d {
	case BF16:
		return F32FromBF16(BF16FromF32(v))
	case F16:
		return F32FromF16(F16FromF32(v))
	}
	return v
}

// DecodeF32 converts the little-endian elements of type d in src to float32
// into dst; len(src) must be len(dst)*d.Size(). I32 elements are converted
// by value.
func DecodeF32(dst []float32, src []byte, d DType) error {
	if !d.Valid() {
		return fmt.Errorf("decode: invalid dtype %v", d)
	}
	if len(src) != len(dst)*d.Size() {
		return fmt.Errorf("decode: %d bytes for %d elements of %v", len(src), len(dst), d)
	}
	switch d {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(le32(src[4*i:]))
		}
	case I32:
		for i := range dst {
			dst[i] = float32(int32(le32(src[4*i:])))
		}
	case BF16:
		for i := range dst {
			dst[i] = F32FromBF16(le16(src[2*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = F32FromF16(le16(src[2*i:]))
		}
	}
	return nil
}

// EncodeF32 converts src to little-endian elements of type d in dst, rounding
// to nearest even; len(dst) must be len(src)*d.Size(). Converting to I32
// rounds to nearest (ties away from zero) and saturates.
func EncodeF32(dst []byte, src []float32, d DType) error {
	if !d.Valid() {
		return fmt.Errorf("encode: invalid dtype %v", d)
	}
	if len(dst) != len(src)*d.Size() {
		return fmt.Errorf("encode: %d bytes for %d elements of %v", len(dst), len(src), d)
	}
	switch d {
	case F32:
		for i, v := range src {
			put32(dst[4*i:], math.Float32bits(v))
		}
	case I32:
		for i, v := range src {
			put32(dst[4*i:], uint32(F32ToI32(v)))
		}
	case BF16:
		for i, v := range src {
			put16(dst[2*i:], BF16FromF32(v))
		}
	case F16:
		for i, v := range src {
			put16(dst[2*i:], F16FromF32(v))
		}
	}
	return nil
}

// F32ToI32 rounds v to the nearest integer (ties away from zero), saturating
// at the int32 range; NaN becomes 0.
func F32ToI32(v float32) int32 {
	switch {
	case v != v:
		return 0
	case v >= math.MaxInt32:
		return math.MaxInt32
	case v <= math.MinInt32:
		return math.MinInt32
	}
	return int32(math.Round(float64(v)))
}

func le16(b []byte) uint16 { return uint16(b[0]) | uint16(b[1])<<8 }
func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
func put16(b []byte, v uint16) { b[0], b[1] = byte(v), byte(v>>8) }
func put32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}
