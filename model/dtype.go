package model

import (
	"math"
	"strings"
)

// Safetensors dtype names that rlpipe loads and writes.
const (
	BF16 = "BF16"
	F16  = "F16"
	F32  = "F32"
)

// safetensorsBits is the element width in bits of every dtype the
// safetensors format defines.
var safetensorsBits = map[string]int{
	"BOOL": 8, "U8": 8, "I8": 8,
	"F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
	"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
	"I16": 16, "U16": 16, "F16": 16, "BF16": 16,
	"I32": 32, "U32": 32, "F32": 32,
	"I64": 64, "U64": 64, "F64": 64,
	"C64": 64,
}

// dtypeAliases maps lower-case spellings used in configs, specs and
// PyTorch to safetensors dtype names.
var dtypeAliases = map[string]string{
	"bf16": BF16, "bfloat16": BF16, "torch.bfloat16": BF16,
	"fp16": F16, "f16": F16, "float16": F16, "half": F16, "torch.float16": F16,
	"fp32": F32, "f32": F32, "float32": F32, "float": F32, "torch.float32": F32,
	"fp64": "F64", "f64": "F64", "float64": "F64", "double": "F64",
	"fp8": "F8_E4M3", "fp8_e4m3": "F8_E4M3", "float8_e4m3fn": "F8_E4M3",
	"fp8_e5m2": "F8_E5M2", "float8_e5m2": "F8_E5M2",
	"int8": "I8", "uint8": "U8", "int16": "I16", "int32": "I32", "int64": "I64",
	"bool": "BOOL",
}

// CanonicalDType returns the safetensors name ("BF16", "F16", "F32", ...)
// for a dtype spelled either as safetensors does or as a common alias
// ("bf16", "bfloat16", "fp16", "float32", ...), and false when it is unknown.
func CanonicalDType(dtype string) (string, bool) {
	if _, ok := safetensorsBits[dtype]; ok {
		return dtype, true
	}
	if s, ok := dtypeAliases[strings.ToLower(dtype)]; ok {
		return s, true
	}
	if _, ok := safetensorsBits[strings.ToUpper(dtype)]; ok {
		return strings.ToUpper(dtype), true
	}
	return "", false
}

// DTypeSize returns the size in bytes of one element of dtype ("bf16",
// "fp16", "fp32", "bfloat16", "BF16", ...), or 0 when the dtype is unknown
// or narrower than a byte.
func DTypeSize(dtype string) int {
	s, ok := CanonicalDType(dtype)
	if !ok {
		return 0
	}
	return safetensorsBits[s] / 8
}

// loadable reports whether ReadRows can convert the safetensors dtype.
func loadable(dtype string) bool { return dtype == BF16 || dtype == F16 || dtype == F32 }

// bf16ToFloat32 widens a bfloat16 bit pattern.
func bf16ToFloat32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// float32ToBF16 narrows to bfloat16 with round-to-nearest-even; NaNs stay
// NaN (quiet) and infinities stay infinite.
func float32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// f16ToFloat32 widens an IEEE half-precision bit pattern.
func f16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		// Subnormal: value = man * 2^-24.
		f := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

// float32ToF16 narrows to IEEE half precision with round-to-nearest-even,
// overflowing to infinity and producing subnormals where needed.
func float32ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	exp := int32(u>>23) & 0xff
	man := u & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00 // quiet NaN
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign // rounds to zero
		}
		// Subnormal half: shift the full significand into place.
		m := man | 0x800000
		shift := uint32(14 - e)
		half := m >> shift
		rem := m & (1<<shift - 1)
		mid := uint32(1) << (shift - 1)
		if rem > mid || (rem == mid && half&1 == 1) {
			half++
		}
		return sign | uint16(half)
	}
	half := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && half&1 == 1) {
		half++ // may carry into the exponent, up to infinity: correct
	}
	return sign | uint16(half)
}
