package cpu

import (
	"encoding/binary"
	"math"
	"reflect"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

const (
	f32  = gpu.F32
	bf16 = gpu.BF16
)

func TestTransfers(t *testing.T) {
	e := newEnv(t)
	vals := []float32{1, 1.00390625, -3.3, 65504, 0}
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16} {
		x := e.up(dt, vals, 5)
		got := e.down(x)
		for i, v := range vals {
			if got[i] != float64(gpu.Round(dt, v)) {
				t.Errorf("%v: element %d = %v, want %v", dt, i, got[i], gpu.Round(dt, v))
			}
		}
		// Copy casts to every other dtype.
		for _, dt2 := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16, gpu.I32} {
			y := e.tensor(dt2, 5)
			if err := e.b.Copy(y, x); err != nil {
				t.Fatal(err)
			}
			got := e.down(y)
			for i, v := range vals {
				w := float64(gpu.Round(dt2, gpu.Round(dt, v)))
				if dt2 == gpu.I32 {
					w = float64(gpu.F32ToI32(gpu.Round(dt, v)))
				}
				if got[i] != w {
					t.Errorf("copy %v->%v: element %d = %v, want %v", dt, dt2, i, got[i], w)
				}
			}
		}
	}
	ids := e.ids([]int32{3, -7, 1 << 30})
	out := make([]int32, 3)
	if err := e.b.DownloadI32(out, ids); err != nil || out[1] != -7 || out[2] != 1<<30 {
		t.Errorf("DownloadI32 = %v, %v", out, err)
	}
	x := e.tensor(bf16, 2, 3)
	if err := e.b.Fill(x, 1.5); err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, 12)
	if err := e.b.DownloadBytes(raw, x); err != nil || raw[0] != 0xc0 || raw[1] != 0x3f {
		t.Errorf("DownloadBytes = %x, %v", raw, err)
	}
	if err := e.b.Zero(x); err != nil {
		t.Fatal(err)
	}
	if got := e.down(x); got[5] != 0 {
		t.Errorf("Zero left %v", got)
	}
	if err := e.b.UploadBytes(x, raw); err != nil || e.down(x)[4] != 1.5 {
		t.Errorf("UploadBytes: %v", err)
	}
	bad := []struct {
		name string
		err  error
	}{
		{"upload count", e.b.Upload(x, []float32{1})},
		{"upload i32 into bf16", e.b.UploadI32(x, make([]int32, 6))},
		{"download count", e.b.Download(make([]float32, 2), x)},
		{"copy count", e.b.Copy(e.tensor(f32, 5), x)},
		{"partial overlap", e.b.Copy(gpu.Tensor{Mem: x.Mem, Off: x.Off + 2, DType: bf16, Shape: []int{5}}, gpu.Tensor{Mem: x.Mem, Off: x.Off, DType: bf16, Shape: []int{5}})},
		{"bytes count", e.b.UploadBytes(x, raw[:3])},
		{"misaligned", e.b.Fill(gpu.Tensor{Mem: x.Mem, Off: 2, DType: f32, Shape: []int{1}}, 1)},
		{"foreign memory", e.b.Zero(gpu.Tensor{Mem: fakeMem{}, DType: f32, Shape: []int{1}})},
	}
	for _, tc := range bad {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

type fakeMem struct{}

func (fakeMem) Size() int64 { return 64 }

func TestGemm(t *testing.T) {
	tests := []struct {
		name          string
		m, n, k       int
		ta, tb        bool
		adt, bdt, cdt gpu.DType
		alpha, beta   float32
	}{
		{"nn small", 5, 7, 3, false, false, f32, f32, f32, 1, 0},
		{"nt across tiles", 70, 65, 300, false, true, f32, f32, f32, 1, 0},
		{"tn bf16 beta", 33, 20, 70, true, false, bf16, bf16, f32, 0.5, 1},
		{"tt mixed bf16 out", 9, 130, 17, true, true, bf16, f32, bf16, 1, 0.5},
		{"f16 operands", 4, 6, 260, false, true, gpu.F16, gpu.F16, f32, 2, -1},
		{"empty k", 3, 4, 0, false, false, f32, f32, f32, 1, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			r := rng()
			ash := []int{tc.m, tc.k}
			if tc.ta {
				ash = []int{tc.k, tc.m}
			}
			bsh := []int{tc.k, tc.n}
			if tc.tb {
				bsh = []int{tc.n, tc.k}
			}
			av := randn(r, tc.m*tc.k, 1, tc.adt)
			bv := randn(r, tc.k*tc.n, 1, tc.bdt)
			cv := randn(r, tc.m*tc.n, 1, tc.cdt)
			a, b, c := e.up(tc.adt, av, ash...), e.up(tc.bdt, bv, bsh...), e.up(tc.cdt, cv, tc.m, tc.n)
			if err := e.b.Gemm(c, a, b, tc.ta, tc.tb, tc.alpha, tc.beta); err != nil {
				t.Fatal(err)
			}
			want := make([]float64, tc.m*tc.n)
			for i := range tc.m {
				for j := range tc.n {
					s := 0.0
					for k := range tc.k {
						x := av[i*tc.k+k]
						if tc.ta {
							x = av[k*tc.m+i]
						}
						y := bv[k*tc.n+j]
						if tc.tb {
							y = bv[j*tc.k+k]
						}
						s += float64(x) * float64(y)
					}
					want[i*tc.n+j] = float64(tc.alpha)*s + float64(tc.beta)*float64(cv[i*tc.n+j])
				}
			}
			rtol := 1e-5
			if tc.cdt == bf16 {
				rtol = 1.0 / 128
			}
			closeTo(t, "c", e.down(c), want, 1e-4, rtol)
		})
	}
}

func TestGemmErrors(t *testing.T) {
	e := newEnv(t)
	a, b, c := e.tensor(f32, 2, 3), e.tensor(f32, 3, 4), e.tensor(f32, 2, 4)
	tests := []struct {
		name    string
		c, a, b gpu.Tensor
		ta, tb  bool
	}{
		{"inner", c, a, b, false, true},
		{"output", e.tensor(f32, 4, 2), a, b, false, false},
		{"rank", c, e.tensor(f32, 6), b, false, false},
		{"int", e.tensor(gpu.I32, 2, 4), a, b, false, false},
		{"alias", a, a, e.tensor(f32, 3, 3), false, false},
		{"missing", c, gpu.Tensor{}, b, false, false},
	}
	for _, tc := range tests {
		if err := e.b.Gemm(tc.c, tc.a, tc.b, tc.ta, tc.tb, 1, 0); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

func TestGemmThreadsDeterministic(t *testing.T) {
	e := newEnv(t)
	r := rng()
	a := e.up(f32, randn(r, 100*90, 1, f32), 100, 90)
	b := e.up(f32, randn(r, 70*90, 1, f32), 70, 90)
	c1, c2 := e.tensor(f32, 100, 70), e.tensor(f32, 100, 70)
	if err := NewWithThreads(1).Gemm(c1, a, b, false, true, 1, 0); err != nil {
		t.Fatal(err)
	}
	if err := NewWithThreads(5).Gemm(c2, a, b, false, true, 1, 0); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "threads", e.down(c2), e.down(c1), 0, 0)
}

func TestBias(t *testing.T) {
	e := newEnv(t)
	r := rng()
	yv, bv, dyv := randn(r, 12, 1, f32), randn(r, 4, 1, f32), randn(r, 12, 1, f32)
	y, b := e.up(f32, yv, 3, 4), e.up(f32, bv, 4)
	if err := e.b.AddBias(y, b); err != nil {
		t.Fatal(err)
	}
	want := make([]float64, 12)
	for i := range want {
		want[i] = float64(yv[i] + bv[i%4])
	}
	closeTo(t, "addbias", e.down(y), want, 0, 0)
	db := e.up(f32, []float32{1, 2, 3, 4}, 4)
	if err := e.b.BiasGrad(db, e.up(f32, dyv, 3, 4)); err != nil {
		t.Fatal(err)
	}
	wantDB := []float64{1, 2, 3, 4}
	for i, v := range dyv {
		wantDB[i%4] += float64(v)
	}
	closeTo(t, "biasgrad", e.down(db), wantDB, 1e-6, 1e-6)
	if err := e.b.AddBias(y, e.tensor(f32, 3)); err == nil {
		t.Error("bias shape mismatch accepted")
	}
	if err := e.b.BiasGrad(e.tensor(f32, 3), y); err == nil {
		t.Error("bias grad shape mismatch accepted")
	}
}

func TestEmbedding(t *testing.T) {
	e := newEnv(t)
	r := rng()
	const v, h = 6, 5
	tab := randn(r, v*h, 1, bf16)
	ids := []int32{2, 0, 2, 5}
	table := e.up(bf16, tab, v, h)
	dst := e.tensor(f32, 4, h)
	idt := e.ids(ids)
	if err := e.b.Embedding(dst, table, idt); err != nil {
		t.Fatal(err)
	}
	var want []float64
	for _, id := range ids {
		want = append(want, f64(tab[int(id)*h:int(id+1)*h])...)
	}
	closeTo(t, "embedding", e.down(dst), want, 0, 0)

	dyv := randn(r, 4*h, 1, f32)
	dt := e.up(f32, make([]float32, v*h), v, h)
	if err := e.b.Fill(dt, 1); err != nil {
		t.Fatal(err)
	}
	if err := e.b.EmbeddingBackward(dt, e.up(f32, dyv, 4, h), idt); err != nil {
		t.Fatal(err)
	}
	wantD := make([]float64, v*h)
	for i := range wantD {
		wantD[i] = 1
	}
	for ti, id := range ids {
		for j := range h {
			wantD[int(id)*h+j] += float64(dyv[ti*h+j])
		}
	}
	closeTo(t, "embedding backward", e.down(dt), wantD, 1e-6, 1e-6)

	if err := e.b.Embedding(dst, table, e.ids([]int32{0, 1, 6, 2})); err == nil {
		t.Error("out-of-range id accepted")
	}
	if err := e.b.Embedding(dst, table, e.ids([]int32{0, -1, 1, 2})); err == nil {
		t.Error("negative id accepted")
	}
	if err := e.b.Embedding(e.tensor(f32, 3, h), table, idt); err == nil {
		t.Error("dst shape mismatch accepted")
	}
	if err := e.b.Embedding(dst, table, e.tensor(f32, 4)); err == nil {
		t.Error("f32 ids accepted")
	}
}

// rmsRef is RMSNorm in float64 (no roundings).
func rmsRef(x, w []float64, h int, eps float64) []float64 {
	y := make([]float64, len(x))
	for r := 0; r < len(x)/h; r++ {
		row := x[r*h : (r+1)*h]
		rs := 1 / math.Sqrt(dot64(row, row)/float64(h)+eps)
		for j := range row {
			y[r*h+j] = w[j] * row[j] * rs
		}
	}
	return y
}

func TestRMSNorm(t *testing.T) {
	const tt, h, eps = 5, 12, 1e-6
	for _, dt := range []gpu.DType{f32, bf16} {
		t.Run(dt.String(), func(t *testing.T) {
			e := newEnv(t)
			r := rng()
			xv, wv := randn(r, tt*h, 2, dt), randn(r, h, 1, dt)
			x, w := e.up(dt, xv, tt, h), e.up(dt, wv, h)
			y, rstd := e.tensor(dt, tt, h), e.tensor(f32, tt)
			if err := e.b.RMSNorm(y, rstd, x, w, eps); err != nil {
				t.Fatal(err)
			}
			// Reference with the HF roundings: normalised x rounded to the
			// input dtype, the product rounded to the output dtype.
			want := make([]float64, tt*h)
			wantR := make([]float64, tt)
			for i := range tt {
				row := f64(xv[i*h : (i+1)*h])
				rs := 1 / math.Sqrt(dot64(row, row)/h+eps)
				wantR[i] = rs
				for j := range h {
					xn := gpu.Round(dt, float32(row[j]*rs))
					want[i*h+j] = float64(gpu.Round(dt, wv[j]*xn))
				}
			}
			tol := 1e-6
			if dt == bf16 {
				tol = 1.0 / 128
			}
			closeTo(t, "y", e.down(y), want, 1e-6, tol)
			closeTo(t, "rstd", e.down(rstd), wantR, 0, 1e-6)
			// In place.
			if err := e.b.RMSNorm(x, rstd, x, w, eps); err != nil {
				t.Fatal(err)
			}
			closeTo(t, "in place", e.down(x), e.down(y), 0, 0)
		})
	}
}

func TestRMSNormBackward(t *testing.T) {
	const tt, h, eps = 3, 7, 1e-5
	e := newEnv(t)
	r := rng()
	xv, wv, dyv := randn(r, tt*h, 1, f32), randn(r, h, 1, f32), randn(r, tt*h, 1, f32)
	x, w, dy := e.up(f32, xv, tt, h), e.up(f32, wv, h), e.up(f32, dyv, tt, h)
	y, rstd := e.tensor(f32, tt, h), e.tensor(f32, tt)
	if err := e.b.RMSNorm(y, rstd, x, w, eps); err != nil {
		t.Fatal(err)
	}
	dx, dw := e.tensor(f32, tt, h), e.up(f32, make([]float32, h), h)
	if err := e.b.Fill(dw, 0.5); err != nil {
		t.Fatal(err)
	}
	if err := e.b.RMSNormBackward(dx, dw, dy, x, w, rstd); err != nil {
		t.Fatal(err)
	}
	x64, w64, dy64 := f64(xv), f64(wv), f64(dyv)
	gx := numGrad(x64, 1e-6, func(x []float64) float64 { return dot64(dy64, rmsRef(x, w64, h, eps)) })
	gw := numGrad(w64, 1e-6, func(w []float64) float64 { return dot64(dy64, rmsRef(x64, w, h, eps)) })
	for i := range gw {
		gw[i] += 0.5
	}
	closeTo(t, "dx", e.down(dx), gx, 1e-5, 1e-4)
	closeTo(t, "dw", e.down(dw), gw, 1e-5, 1e-4)
	// dx may overwrite dy; dw may be skipped.
	if err := e.b.RMSNormBackward(dy, gpu.Tensor{}, dy, x, w, rstd); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "dx in place", e.down(dy), e.down(dx), 0, 0)
	if err := e.b.RMSNormBackward(dx, e.tensor(f32, h+1), dy, x, w, rstd); err == nil {
		t.Error("dw shape mismatch accepted")
	}
	if err := e.b.RMSNorm(y, rstd, x, e.tensor(f32, h-1), eps); err == nil {
		t.Error("w shape mismatch accepted")
	}
}

// ropeRef rotates x [T,heads,D] in float64 (rotate-half convention).
func ropeRef(x []float64, pos []int32, heads, d int, inv []float32, sign float64) []float64 {
	y := make([]float64, len(x))
	half := d / 2
	for ti, p := range pos {
		for hd := range heads {
			o := (ti*heads + hd) * d
			for i := range half {
				a := float64(p) * float64(inv[i])
				c, s := math.Cos(a), sign*math.Sin(a)
				y[o+i] = x[o+i]*c - x[o+i+half]*s
				y[o+i+half] = x[o+i+half]*c + x[o+i]*s
			}
		}
	}
	return y
}

func TestRoPE(t *testing.T) {
	const tt, heads, d = 5, 3, 8
	pos := []int32{0, 1, 2, 0, 7}
	scalings := []*gpu.RoPEScaling{nil, {Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 16}}
	for _, sc := range scalings {
		e := newEnv(t)
		r := rng()
		xv := randn(r, tt*heads*d, 1, f32)
		x, p := e.up(f32, xv, tt, heads, d), e.ids(pos)
		inv, err := gpu.RoPEInvFreq(d, 100, sc)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.b.RoPE(x, p, 100, sc); err != nil {
			t.Fatal(err)
		}
		closeTo(t, "rope", e.down(x), ropeRef(f64(xv), pos, heads, d, inv, 1), 1e-6, 1e-6)
		// Backward is the transpose: check by finite differences of
		// L = dy·rope(x), and that it undoes the forward.
		dyv := randn(r, tt*heads*d, 1, f32)
		dy := e.up(f32, dyv, tt, heads, d)
		if err := e.b.RoPEBackward(dy, p, 100, sc); err != nil {
			t.Fatal(err)
		}
		g := numGrad(f64(xv), 1e-4, func(x []float64) float64 {
			return dot64(f64(dyv), ropeRef(x, pos, heads, d, inv, 1))
		})
		closeTo(t, "rope backward", e.down(dy), g, 1e-6, 1e-5)
		if err := e.b.RoPEBackward(x, p, 100, sc); err != nil {
			t.Fatal(err)
		}
		closeTo(t, "rope inverse", e.down(x), f64(xv), 1e-6, 1e-6)
	}
	// BF16 follows HF: cos/sin rounded to bf16, each product and the sum
	// rounded to bf16.
	e := newEnv(t)
	r := rng()
	xv := randn(r, tt*heads*d, 1, bf16)
	x, p := e.up(bf16, xv, tt, heads, d), e.ids(pos)
	if err := e.b.RoPE(x, p, 10000, nil); err != nil {
		t.Fatal(err)
	}
	inv, _ := gpu.RoPEInvFreq(d, 10000, nil)
	want := make([]float64, len(xv))
	rd := func(v float32) float32 { return gpu.Round(bf16, v) }
	for ti, ps := range pos {
		for hd := range heads {
			o := (ti*heads + hd) * d
			for i := range d / 2 {
				a := float64(float32(ps) * inv[i])
				c, s := rd(float32(math.Cos(a))), rd(float32(math.Sin(a)))
				x1, x2 := xv[o+i], xv[o+i+d/2]
				want[o+i] = float64(rd(rd(x1*c) + rd(-x2*s)))
				want[o+i+d/2] = float64(rd(rd(x2*c) + rd(x1*s)))
			}
		}
	}
	closeTo(t, "rope bf16", e.down(x), want, 0, 0)
	bad := []struct {
		name string
		err  error
	}{
		{"odd head dim", e.b.RoPE(e.tensor(f32, 2, 1, 3), e.ids([]int32{0, 1}), 1e4, nil)},
		{"pos length", e.b.RoPE(x, e.ids([]int32{0}), 1e4, nil)},
		{"rank", e.b.RoPE(e.tensor(f32, 2, 8), e.ids([]int32{0, 1}), 1e4, nil)},
		{"scaling", e.b.RoPE(x, p, 1e4, &gpu.RoPEScaling{Type: "dynamic"})},
	}
	for _, tc := range bad {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

func silu(x float64) float64 { return x / (1 + math.Exp(-x)) }

func TestSwiGLU(t *testing.T) {
	const n = 3 * 700 // Spans several elementwise chunks.
	e := newEnv(t)
	r := rng()
	gv, uv, dv := randn(r, n, 2, f32), randn(r, n, 1, f32), randn(r, n, 1, f32)
	g, u, out := e.up(f32, gv, 3, 700), e.up(f32, uv, 3, 700), e.tensor(f32, 3, 700)
	if err := e.b.SwiGLU(out, g, u); err != nil {
		t.Fatal(err)
	}
	ref := func(g, u []float64) []float64 {
		y := make([]float64, len(g))
		for i := range g {
			y[i] = silu(g[i]) * u[i]
		}
		return y
	}
	closeTo(t, "swiglu", e.down(out), ref(f64(gv), f64(uv)), 1e-6, 1e-5)
	dg, du := e.tensor(f32, 3, 700), e.tensor(f32, 3, 700)
	d := e.up(f32, dv, 3, 700)
	if err := e.b.SwiGLUBackward(dg, du, d, g, u); err != nil {
		t.Fatal(err)
	}
	// Elementwise, so a single finite-difference pass covers every element.
	g64, u64, d64 := f64(gv), f64(uv), f64(dv)
	wantG, wantU := make([]float64, n), make([]float64, n)
	const h = 1e-6
	for i := range n {
		wantG[i] = d64[i] * (silu(g64[i]+h) - silu(g64[i]-h)) / (2 * h) * u64[i]
		wantU[i] = d64[i] * silu(g64[i])
	}
	closeTo(t, "dgate", e.down(dg), wantG, 1e-5, 1e-4)
	closeTo(t, "dup", e.down(du), wantU, 1e-6, 1e-5)
	// dGate may overwrite dOut.
	if err := e.b.SwiGLUBackward(d, du, d, g, u); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "dgate in place", e.down(d), e.down(dg), 0, 0)
	if err := e.b.SwiGLU(out, g, e.tensor(f32, 700, 3)); err == nil {
		t.Error("shape mismatch accepted")
	}
	if err := e.b.SwiGLUBackward(g, du, d, g, u); err == nil {
		t.Error("dGate aliasing gate accepted")
	}
}

func TestElementwise(t *testing.T) {
	e := newEnv(t)
	r := rng()
	av, bv := randn(r, 50, 1, bf16), randn(r, 50, 1, f32)
	a, b := e.up(bf16, av, 5, 10), e.up(f32, bv, 5, 10)
	dst := e.tensor(f32, 5, 10)
	if err := e.b.Add(dst, a, b); err != nil {
		t.Fatal(err)
	}
	want := make([]float64, 50)
	for i := range want {
		want[i] = float64(av[i] + bv[i])
	}
	closeTo(t, "add", e.down(dst), want, 0, 0)
	if err := e.b.Scale(dst, 2); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		want[i] *= 2
	}
	closeTo(t, "scale", e.down(dst), want, 0, 0)
	if err := e.b.AddScaled(dst, b, -0.5); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		want[i] += -0.5 * float64(bv[i])
	}
	closeTo(t, "addscaled", e.down(dst), want, 1e-6, 1e-6)
	if err := e.b.Add(a, a, b); err != nil { // In place into bf16.
		t.Fatal(err)
	}
	for i := range av {
		want[i] = float64(gpu.Round(bf16, av[i]+bv[i]))
	}
	closeTo(t, "add in place", e.down(a), want, 0, 0)
	if err := e.b.Add(dst, a, e.tensor(f32, 50)); err == nil {
		t.Error("shape mismatch accepted")
	}
	if err := e.b.Scale(e.tensor(gpu.I32, 3), 2); err == nil {
		t.Error("int scale accepted")
	}
}

func TestAdamW(t *testing.T) {
	e := newEnv(t)
	p, g := e.up(f32, []float32{1, -2}, 2), e.tensor(f32, 2)
	m, v := e.tensor(f32, 2), e.tensor(f32, 2)
	steps := []struct {
		g          []float32
		p0, m0, v0 float64 // Hand-computed for element 0.
	}{
		{[]float32{0.5, 0}, 0.899000002, 0.05, 0.00025},
		{[]float32{-0.25, 0}, 0.8714672987058463, 0.02, 0.00031225},
	}
	for i, s := range steps {
		if err := e.b.Upload(g, s.g); err != nil {
			t.Fatal(err)
		}
		if err := e.b.AdamW(p, g, m, v, gpu.AdamWStep{LR: 0.1, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: i + 1}); err != nil {
			t.Fatal(err)
		}
		// Element 1 has zero gradient: only weight decay moves it.
		wantP1 := -2 * math.Pow(1-0.1*0.01, float64(i+1))
		closeTo(t, "p", e.down(p), []float64{s.p0, wantP1}, 0, 3e-7)
		closeTo(t, "m", e.down(m), []float64{s.m0, 0}, 0, 3e-7)
		closeTo(t, "v", e.down(v), []float64{s.v0, 0}, 0, 3e-7)
	}
	bad := []struct {
		name string
		err  error
	}{
		{"step 0", e.b.AdamW(p, g, m, v, gpu.AdamWStep{LR: 0.1, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8})},
		{"beta", e.b.AdamW(p, g, m, v, gpu.AdamWStep{LR: 0.1, Beta1: 1, Beta2: 0.999, Eps: 1e-8, Step: 1})},
		{"grad scale", e.b.AdamW(p, g, m, v, gpu.AdamWStep{LR: 0.1, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, Step: 1, GradScale: -1})},
		{"bf16", e.b.AdamW(e.tensor(bf16, 2), g, m, v, gpu.AdamWStep{LR: 0.1, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, Step: 1})},
		{"shape", e.b.AdamW(p, e.tensor(f32, 3), m, v, gpu.AdamWStep{LR: 0.1, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, Step: 1})},
		{"alias", e.b.AdamW(p, g, m, m, gpu.AdamWStep{LR: 0.1, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, Step: 1})},
	}
	for _, tc := range bad {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

// A grad scale gives exactly the step of grads scaled beforehand (in
// float32, as clip_grad_norm_ scales them), and leaves the grads as they are.
func TestAdamWGradScale(t *testing.T) {
	e := newEnv(t)
	gv := []float32{0.5, -0.25, 3, 1e-3}
	scaled := make([]float32, len(gv))
	for i, x := range gv {
		scaled[i] = x * 0.37
	}
	st := gpu.AdamWStep{LR: 0.1, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: 1}
	p1, g1, m1, v1 := e.up(f32, []float32{1, -2, 0.5, 4}, 4), e.up(f32, gv, 4), e.tensor(f32, 4), e.tensor(f32, 4)
	p2, g2, m2, v2 := e.up(f32, []float32{1, -2, 0.5, 4}, 4), e.up(f32, scaled, 4), e.tensor(f32, 4), e.tensor(f32, 4)
	withScale := st
	withScale.GradScale = 0.37
	if err := e.b.AdamW(p1, g1, m1, v1, withScale); err != nil {
		t.Fatal(err)
	}
	if err := e.b.AdamW(p2, g2, m2, v2, st); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		a, b gpu.Tensor
	}{{"p", p1, p2}, {"m", m1, m2}, {"v", v1, v2}} {
		if a, b := e.down(c.a), e.down(c.b); !reflect.DeepEqual(a, b) {
			t.Errorf("%s with grad scale %v, with grads scaled first %v", c.name, a, b)
		}
	}
	if got := e.down(g1); !reflect.DeepEqual(got, []float64{0.5, -0.25, 3, float64(float32(1e-3))}) {
		t.Errorf("grads changed to %v", got)
	}
}

func TestSumSquares(t *testing.T) {
	e := newEnv(t)
	r := rng()
	xv := randn(r, 100000, 1, bf16)
	want := 0.0
	for _, v := range xv {
		want += float64(v) * float64(v)
	}
	got, err := e.b.SumSquares(e.up(bf16, xv, 100, 1000))
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(got-want) > 1e-9*want {
		t.Errorf("SumSquares = %v, want %v", got, want)
	}
	if _, err := e.b.SumSquares(e.tensor(gpu.I32, 2)); err == nil {
		t.Error("int tensor accepted")
	}
	// SumSquaresTo writes the same float64's bytes into an 8-byte tensor.
	dst := e.tensor(gpu.I32, 2)
	if err := e.b.SumSquaresTo(dst, e.up(bf16, xv, 100, 1000)); err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, 8)
	if err := e.b.DownloadBytes(raw, dst); err != nil {
		t.Fatal(err)
	}
	if to := math.Float64frombits(binary.LittleEndian.Uint64(raw)); to != got {
		t.Errorf("SumSquaresTo = %v, want %v", to, got)
	}
	if err := e.b.SumSquaresTo(e.tensor(gpu.I32, 3), e.up(bf16, xv, 100, 1000)); err == nil {
		t.Error("a 12-byte dst accepted")
	}
}

// TestZeroTokens runs the token-indexed ops on zero tokens: they must do
// nothing and return no error.
func TestZeroTokens(t *testing.T) {
	e := newEnv(t)
	const h, hd, v = 8, 4, 10
	x, y, rstd := e.tensor(f32, 0, h), e.tensor(f32, 0, h), e.tensor(f32, 0)
	w, ids := e.tensor(f32, h), e.tensor(gpu.I32, 0)
	q, k := e.tensor(f32, 0, 2, hd), e.tensor(f32, 0, 1, hd)
	lse, cu := e.tensor(f32, 2, 0), e.ids([]int32{0})
	calls := []struct {
		name string
		err  error
	}{
		{"embedding", e.b.Embedding(y, e.tensor(f32, v, h), ids)},
		{"rmsnorm", e.b.RMSNorm(y, rstd, x, w, 1e-6)},
		{"rmsnorm backward", e.b.RMSNormBackward(y, e.tensor(f32, h), x, x, w, rstd)},
		{"gemm", e.b.Gemm(e.tensor(f32, 0, v), x, e.tensor(f32, v, h), false, true, 1, 0)},
		{"rope", e.b.RoPE(q, ids, 1e4, nil)},
		{"attention", e.b.Attention(e.tensor(f32, 0, 2, hd), lse, q, k, k, cu, 1)},
		{"swiglu", e.b.SwiGLU(y, x, x)},
		{"logprobs", e.b.LogProbs(rstd, gpu.Tensor{}, x, e.tensor(f32, v, h), ids, 1, false, e.tensor(f32, 0, v), gpu.Tensor{})},
	}
	for _, c := range calls {
		if c.err != nil {
			t.Errorf("%s: %v", c.name, c.err)
		}
	}
}

func TestCopyRows(t *testing.T) {
	e := newEnv(t)
	r := rng()
	const v, h = 7, 5
	for _, dt := range []gpu.DType{f32, bf16} {
		src := randn(r, v*h, 1, dt)
		old := randn(r, v*h, 1, dt)
		rows := []int32{4, 0, 4, 6} // a repeat copies the same row again
		dst := e.up(dt, old, v, h)
		if err := e.b.CopyRows(dst, e.up(dt, src, v, h), e.ids(rows)); err != nil {
			t.Fatal(err)
		}
		want := f64(old)
		for _, id := range rows {
			copy(want[int(id)*h:int(id+1)*h], f64(src[int(id)*h:int(id+1)*h]))
		}
		closeTo(t, "copy rows "+dt.String(), e.down(dst), want, 0, 0)
	}
	dst, src := e.tensor(f32, v, h), e.tensor(f32, v, h)
	for _, c := range []struct {
		name           string
		dst, src, rows gpu.Tensor
	}{
		{"a row past the end", dst, src, e.ids([]int32{1, v})},
		{"a negative row", dst, src, e.ids([]int32{-1})},
		{"dtypes differ", e.tensor(bf16, v, h), src, e.ids([]int32{1})},
		{"shapes differ", e.tensor(f32, v, h+1), src, e.ids([]int32{1})},
		{"rows not I32", dst, src, e.tensor(f32, 1)},
		{"dst is src", src, src, e.ids([]int32{1})},
	} {
		if err := e.b.CopyRows(c.dst, c.src, c.rows); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
}

// TestAddScaledF32 holds float32 AddScaled (vectors where the CPU has
// AVX2, over spans handed out to the workers) to Go's arithmetic bit for
// bit: lengths around the vector widths and a span, several scales, and
// signed zeros, infinities and NaNs (a NaN for a NaN: Go's compiler may
// take either operand's payload when two meet).
func TestAddScaledF32(t *testing.T) {
	e := newEnv(t)
	r := rng()
	specials := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
		math.Float32frombits(0x7fc00123), math.Float32frombits(0xffc00456), 1e-45, 3.4e38}
	for _, n := range []int{1, 7, 8, 15, 16, 17, 40, addSpan + 9} {
		for _, s := range []float32{1, 0.37, -2} {
			d, x := randn(r, n, 1, f32), randn(r, n, 1, f32)
			for k := range min(n, len(specials)) {
				d[k], x[k] = specials[k], specials[k^1]
			}
			want := append([]float32(nil), d...)
			for i := range want {
				want[i] += float32(s * x[i])
			}
			dt := e.up(f32, d, n)
			if err := e.b.AddScaled(dt, e.up(f32, x, n), s); err != nil {
				t.Fatal(err)
			}
			got := make([]float32, n)
			if err := e.b.Download(got, dt); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				nan := math.IsNaN(float64(got[i])) && math.IsNaN(float64(want[i])) // Go picks either NaN operand
				if !nan && math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("n %d, s %v: [%d] = %#x, want %#x", n, s, i, math.Float32bits(got[i]), math.Float32bits(want[i]))
				}
			}
		}
	}
}
