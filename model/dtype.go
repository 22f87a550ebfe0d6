package model

import (
	"github.com/rlpipe/rlpipe/gpu"
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

// The conversions between float32 and 16-bit floats are the backend's, so a
// checkpoint reads and writes exactly as a bf16 or fp16 tensor rounds.
var (
	bf16ToFloat32 = gpu.F32FromBF16
	float32ToBF16 = gpu.BF16FromF32
	f16ToFloat32  = gpu.F32FromF16
	float32ToF16  = gpu.F16FromF32
)
