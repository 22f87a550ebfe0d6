package gpu

import (
	"math"
	"testing"
)

type hostMem []byte

func (m hostMem) Size() int64       { return int64(len(m)) }
func (m hostMem) HostBytes() []byte { return m }

func TestParseGPU(t *testing.T) {
	tests := []struct {
		in    string
		name  string
		bytes int64
		bad   bool
	}{
		{in: "h100-80g", name: "h100-80g", bytes: 85017493504},
		{in: "H200-141G", name: "h200-141g", bytes: 150109880320},
		{in: "a100-80g", name: "a100-80g", bytes: 81920 << 20},
		{in: "a100-40g", name: "a100-40g", bytes: 40960 << 20},
		{in: "l40s-48g", name: "l40s-48g", bytes: 46068 << 20},
		{in: "85520809984", name: "custom", bytes: 85520809984},
		{in: "80GiB", name: "custom", bytes: 80 << 30},
		{in: "80 gib", name: "custom", bytes: 80 << 30},
		{in: "79.5GiB", name: "custom", bytes: 795 << 30 / 10},
		{in: "80GB", name: "custom", bytes: 80e9},
		{in: "512MiB", name: "custom", bytes: 512 << 20},
		{in: "1024B", name: "custom", bytes: 1024},
		{in: "", bad: true},
		{in: "0", bad: true},
		{in: "-5", bad: true},
		{in: "80XB", bad: true},
		{in: "GiB", bad: true},
		{in: "h100", bad: true},
		{in: "1e30GiB", bad: true},
	}
	for _, tc := range tests {
		name, b, err := ParseGPU(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseGPU(%q) = %q, %d; want error", tc.in, name, b)
			}
			continue
		}
		if err != nil || name != tc.name || b != tc.bytes {
			t.Errorf("ParseGPU(%q) = %q, %d, %v; want %q, %d", tc.in, name, b, err, tc.name, tc.bytes)
		}
	}
}

func TestTensorViews(t *testing.T) {
	mem := make(hostMem, 256)
	x, err := NewTensor(mem, 16, F32, 4, 6)
	if err != nil {
		t.Fatal(err)
	}
	if x.Numel() != 24 || x.Bytes() != 96 || x.Dim(-1) != 6 || x.Dim(5) != 0 {
		t.Errorf("numel %d bytes %d", x.Numel(), x.Bytes())
	}
	r, err := x.Rows(1, 3)
	if err != nil || r.Off != 16+24 || r.Shape[0] != 2 {
		t.Errorf("Rows = %v, %v", r, err)
	}
	y, err := x.Reshape(-1, 3)
	if err != nil || y.Shape[0] != 8 {
		t.Errorf("Reshape = %v, %v", y, err)
	}
	f, err := x.Flat(2, 5)
	if err != nil || f.Off != 24 || f.Numel() != 3 {
		t.Errorf("Flat = %v, %v", f, err)
	}
	b, err := x.HostBytes()
	if err != nil || len(b) != 96 {
		t.Errorf("HostBytes = %d, %v", len(b), err)
	}
	bad := []struct {
		name string
		err  error
	}{
		{"past end", func() error { _, err := NewTensor(mem, 200, F32, 20); return err }()},
		{"misaligned", func() error { _, err := NewTensor(mem, 2, F32, 2); return err }()},
		{"negative dim", func() error { _, err := NewTensor(mem, 0, F32, -1); return err }()},
		{"bad dtype", func() error { _, err := NewTensor(mem, 0, 0, 1); return err }()},
		{"no memory", func() error { _, err := NewTensor(nil, 0, F32, 1); return err }()},
		{"reshape count", func() error { _, err := x.Reshape(5, 5); return err }()},
		{"reshape infer", func() error { _, err := x.Reshape(-1, 5); return err }()},
		{"rows range", func() error { _, err := x.Rows(3, 9); return err }()},
		{"flat range", func() error { _, err := x.Flat(-1, 2); return err }()},
	}
	for _, tc := range bad {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	if !(Tensor{}).Empty() {
		t.Error("zero tensor is not empty")
	}
}

func TestRoPEInvFreqDefault(t *testing.T) {
	inv, err := RoPEInvFreq(8, 10000, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{1, 0.1, 0.01, 0.001}
	for i, w := range want {
		if math.Abs(float64(inv[i])-w) > 1e-6*w {
			t.Errorf("inv[%d] = %v, want %v", i, inv[i], w)
		}
	}
	lin, err := RoPEInvFreq(8, 10000, &RoPEScaling{Type: "linear", Factor: 4})
	if err != nil || lin[1] != inv[1]/4 {
		t.Errorf("linear: %v, %v", lin, err)
	}
	for _, bad := range []struct {
		d     int
		theta float64
		s     *RoPEScaling
	}{{7, 1e4, nil}, {0, 1e4, nil}, {8, 0, nil}, {8, 1e4, &RoPEScaling{Type: "yarn"}},
		{8, 1e4, &RoPEScaling{Type: "linear"}}, {8, 1e4, &RoPEScaling{Type: "llama3", Factor: 8}}} {
		if _, err := RoPEInvFreq(bad.d, bad.theta, bad.s); err == nil {
			t.Errorf("RoPEInvFreq(%d, %v, %+v) accepted", bad.d, bad.theta, bad.s)
		}
	}
}

// TestRoPEInvFreqLlama3 checks the Llama 3.1 settings against the formula
// of HF _compute_llama3_parameters evaluated in float64.
func TestRoPEInvFreqLlama3(t *testing.T) {
	s := &RoPEScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}
	const d, theta = 128, 500000.0
	inv, err := RoPEInvFreq(d, theta, s)
	if err != nil {
		t.Fatal(err)
	}
	var nHigh, nLow, nMid int
	for i := range d / 2 {
		f := 1 / math.Pow(theta, float64(2*i)/d)
		wl := 2 * math.Pi / f
		want := f
		switch {
		case wl < 8192/4.0:
			nHigh++
		case wl > 8192/1.0:
			want = f / 8
			nLow++
		default:
			sm := (8192/wl - 1) / (4 - 1)
			want = (1-sm)*f/8 + sm*f
			nMid++
		}
		if math.Abs(float64(inv[i])-want) > 2e-6*want {
			t.Errorf("inv[%d] = %.9g, want %.9g", i, inv[i], want)
		}
	}
	if nHigh == 0 || nLow == 0 || nMid == 0 {
		t.Errorf("test does not cover all bands: %d high, %d mid, %d low", nHigh, nMid, nLow)
	}
	// Known values: the first frequency is untouched, the last is divided
	// by the factor: 500000^(-126/128)/8.
	if inv[0] != 1 {
		t.Errorf("inv[0] = %v, want 1", inv[0])
	}
	if last := math.Pow(500000, -126.0/128) / 8; math.Abs(float64(inv[63])-last) > 1e-6*last {
		t.Errorf("inv[63] = %v, want %v", inv[63], last)
	}
}
