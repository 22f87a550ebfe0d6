package gpu

import (
	"math"
	"testing"
)

func TestBF16FromF32(t *testing.T) {
	tests := []struct {
		name string
		in   uint32 // float32 bits
		want uint16
	}{
		{"one", 0x3f800000, 0x3f80},
		{"exact", 0x40490000, 0x4049},
		{"below half rounds down", 0x3f807fff, 0x3f80},
		{"above half rounds up", 0x3f808001, 0x3f81},
		{"tie to even stays", 0x3f808000, 0x3f80},
		{"tie to even goes up", 0x3f818000, 0x3f82},
		{"negative tie", 0xbf818000, 0xbf82},
		{"max finite overflows to inf", 0x7f7fffff, 0x7f80},
		{"inf", 0x7f800000, 0x7f80},
		{"-inf", 0xff800000, 0xff80},
		{"zero", 0, 0},
		{"-zero", 0x80000000, 0x8000},
		{"subnormal", 0x00010000, 0x0001},
		{"quiet nan", 0x7fc00000, 0x7fc0},
		{"signalling nan stays nan", 0x7f800001, 0x7fc0},
		{"negative nan payload", 0xffa00000, 0xffe0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := BF16FromF32(math.Float32frombits(tc.in))
			if got != tc.want {
				t.Errorf("BF16FromF32(%#08x) = %#04x, want %#04x", tc.in, got, tc.want)
			}
		})
	}
	for _, h := range []uint16{0x3f80, 0xc2f7, 0x0001, 0x7f80, 0x8000} {
		if got := BF16FromF32(F32FromBF16(h)); got != h {
			t.Errorf("round trip of %#04x = %#04x", h, got)
		}
	}
	if f := F32FromBF16(0x7fc0); !math.IsNaN(float64(f)) {
		t.Errorf("F32FromBF16(nan) = %v", f)
	}
}

func TestF16(t *testing.T) {
	tests := []struct {
		name string
		in   float32
		want uint16
	}{
		{"one", 1, 0x3c00},
		{"-two", -2, 0xc000},
		{"max", 65504, 0x7bff},
		{"overflow", 65520, 0x7c00},
		{"just below overflow rounds down", 65519, 0x7bff},
		{"smallest normal", float32(math.Ldexp(1, -14)), 0x0400},
		{"smallest subnormal", float32(math.Ldexp(1, -24)), 0x0001},
		{"half of smallest subnormal ties to zero", float32(math.Ldexp(1, -25)), 0x0000},
		{"above half of smallest subnormal", float32(math.Ldexp(1.5, -25)), 0x0001},
		{"1.5 subnormal units ties to even 2", float32(math.Ldexp(3, -25)), 0x0002},
		{"tie to even at one", 1 + float32(math.Ldexp(1, -11)), 0x3c00},
		{"tie to even up", 1 + float32(math.Ldexp(3, -11)), 0x3c02},
		{"inf", float32(math.Inf(1)), 0x7c00},
		{"-inf", float32(math.Inf(-1)), 0xfc00},
		{"tiny", 1e-10, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := F16FromF32(tc.in); got != tc.want {
				t.Errorf("F16FromF32(%g) = %#04x, want %#04x", tc.in, got, tc.want)
			}
		})
	}
	if h := F16FromF32(float32(math.NaN())); h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
		t.Errorf("F16FromF32(NaN) = %#04x, not a NaN", h)
	}
	// Every half value survives a round trip through float32.
	for h := range 1 << 16 {
		f := F32FromF16(uint16(h))
		if math.IsNaN(float64(f)) {
			continue
		}
		if got := F16FromF32(f); got != uint16(h) {
			t.Fatalf("round trip of %#04x via %g = %#04x", h, f, got)
		}
	}
}

func TestEncodeDecode(t *testing.T) {
	vals := []float32{0, 1, -2.5, 3.140625, 1e5, -7}
	for _, dt := range []DType{F32, BF16, F16, I32} {
		b := make([]byte, len(vals)*dt.Size())
		if err := EncodeF32(b, vals, dt); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, len(vals))
		if err := DecodeF32(got, b, dt); err != nil {
			t.Fatal(err)
		}
		for i, v := range vals {
			want := Round(dt, v)
			if dt == I32 {
				want = float32(F32ToI32(v))
			}
			if got[i] != want {
				t.Errorf("%v: element %d = %v, want %v", dt, i, got[i], want)
			}
		}
		if err := EncodeF32(b[1:], vals, dt); err == nil {
			t.Errorf("%v: short buffer accepted", dt)
		}
	}
	if err := DecodeF32(nil, nil, 0); err == nil {
		t.Error("invalid dtype accepted")
	}
}

func TestParseDType(t *testing.T) {
	for _, s := range []string{"bf16", "BF16", "bfloat16"} {
		if d, err := ParseDType(s); err != nil || d != BF16 {
			t.Errorf("ParseDType(%q) = %v, %v", s, d, err)
		}
	}
	if _, err := ParseDType("f8"); err == nil {
		t.Error("ParseDType(f8) succeeded")
	}
}
