//go:build cgo

package cuda

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
)

// Every op is compared with the CPU reference on fresh random inputs, with
// the CUDA outputs poisoned (NaN) beforehand. The error measure is
// ‖got−want‖₂/‖want‖₂; NaN never passes. Thresholds: float32 1e-5 (GEMM,
// attention and log-probs 1e-4), bf16/f16 1e-2.

const (
	tolF32   = 1e-5
	tolHeavy = 1e-4
	tol16    = 1e-2
)

var (
	sharedOnce sync.Once
	shared     *Backend
	sharedErr  error

	sumMu   sync.Mutex
	summary = map[string]float64{}
)

func TestMain(m *testing.M) {
	code := m.Run()
	if len(summary) > 0 {
		var keys []string
		for k := range summary {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Println("max relative error per op (‖got−want‖/‖want‖ against gpu/cpu):")
		for _, k := range keys {
			fmt.Printf("  %-48s %.3g\n", k, summary[k])
		}
	}
	if shared != nil {
		_ = shared.Close()
	}
	os.Exit(code)
}

// backend returns the shared CUDA backend or skips without a driver.
func backend(t testing.TB) *Backend {
	t.Helper()
	sharedOnce.Do(func() {
		start := time.Now()
		shared, sharedErr = New(0)
		if sharedErr == nil {
			fmt.Printf("cuda backend ready in %v (%d kernel modules compiled this run)\n", time.Since(start), compiles.Load())
			if info, err := Versions(); err == nil {
				fmt.Println(info)
			}
		}
	})
	if errors.Is(sharedErr, ErrNoDriver) {
		t.Skip(sharedErr.Error()) // "cuda: no driver: ..."
	}
	if sharedErr != nil {
		t.Fatalf("cuda backend: %v", sharedErr)
	}
	return shared
}

// env pairs a CUDA arena with a CPU one: tensors are bump-allocated at the
// same offsets of both.
type env struct {
	t      *testing.T
	g      *Backend
	c      *cpu.Backend
	gm, cm gpu.Memory
	off    int64
	r      *rand.Rand
}

func newEnv(t *testing.T) *env {
	t.Helper()
	g := backend(t)
	const size = 320 << 20
	gm, err := g.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	c := cpu.New()
	cm, _ := c.Alloc(size)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	t.Cleanup(func() {
		if err := g.Sync(); err != nil {
			t.Errorf("sync: %v", err)
		}
		if err := g.Free(gm); err != nil {
			t.Errorf("free: %v", err)
		}
	})
	return &env{t: t, g: g, c: c, gm: gm, cm: cm, r: rand.New(rand.NewPCG(seed, 7))}
}

// alloc returns the same view in both arenas.
func (e *env) alloc(dt gpu.DType, shape ...int) (gpu.Tensor, gpu.Tensor) {
	e.t.Helper()
	g, err := gpu.NewTensor(e.gm, e.off, dt, shape...)
	if err != nil {
		e.t.Fatal(err)
	}
	c, err := gpu.NewTensor(e.cm, e.off, dt, shape...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.off += (g.Bytes() + 255) / 256 * 256
	return g, c
}

func (e *env) randn(n int, scale float64, dt gpu.DType) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = gpu.Round(dt, float32(e.r.NormFloat64()*scale))
	}
	return v
}

// in returns a pair holding the same random values (rounded to dt).
func (e *env) in(dt gpu.DType, scale float64, shape ...int) (gpu.Tensor, gpu.Tensor) {
	e.t.Helper()
	g, c := e.alloc(dt, shape...)
	vals := e.randn(g.Numel(), scale, dt)
	e.set(g, c, vals)
	return g, c
}

func (e *env) set(g, c gpu.Tensor, vals []float32) {
	e.t.Helper()
	if err := e.g.Upload(g, vals); err != nil {
		e.t.Fatal(err)
	}
	if err := e.c.Upload(c, vals); err != nil {
		e.t.Fatal(err)
	}
}

// out returns an output pair; the CUDA side is poisoned with NaN (or a
// sentinel for I32) so that unwritten elements fail.
func (e *env) out(dt gpu.DType, shape ...int) (gpu.Tensor, gpu.Tensor) {
	e.t.Helper()
	g, c := e.alloc(dt, shape...)
	if err := e.g.Fill(g, float32(math.NaN())); err != nil {
		e.t.Fatal(err)
	}
	if dt == gpu.I32 {
		if err := e.g.Fill(g, -123456); err != nil {
			e.t.Fatal(err)
		}
	}
	return g, c
}

func (e *env) ids(vals []int32) (gpu.Tensor, gpu.Tensor) {
	e.t.Helper()
	g, c := e.alloc(gpu.I32, len(vals))
	if err := e.g.UploadI32(g, vals); err != nil {
		e.t.Fatal(err)
	}
	if err := e.c.UploadI32(c, vals); err != nil {
		e.t.Fatal(err)
	}
	return g, c
}

func (e *env) randIDs(n, v int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(e.r.IntN(v))
	}
	return ids
}

// check runs both ops; an error from either fails the test.
func (e *env) check(name string, gerr, cerr error) {
	e.t.Helper()
	if gerr != nil {
		e.t.Fatalf("%s: cuda: %v", name, gerr)
	}
	if cerr != nil {
		e.t.Fatalf("%s: cpu: %v", name, cerr)
	}
}

// compare downloads both tensors and checks the relative error.
func (e *env) compare(name string, g, c gpu.Tensor, tol float64) {
	e.t.Helper()
	got := make([]float32, g.Numel())
	want := make([]float32, c.Numel())
	if err := e.g.Download(got, g); err != nil {
		e.t.Fatalf("%s: download: %v", name, err)
	}
	if err := e.c.Download(want, c); err != nil {
		e.t.Fatalf("%s: cpu download: %v", name, err)
	}
	e.compareVals(name, got, want, tol)
}

func (e *env) compareVals(name string, got, want []float32, tol float64) {
	e.t.Helper()
	var num, den float64
	bad := -1
	for i := range got {
		g, w := float64(got[i]), float64(want[i])
		if math.IsNaN(g) != math.IsNaN(w) || math.IsInf(g, 0) != math.IsInf(w, 0) {
			bad = i
			break
		}
		if math.IsNaN(w) || math.IsInf(w, 0) {
			continue
		}
		num += (g - w) * (g - w)
		den += w * w
	}
	if bad >= 0 {
		e.t.Errorf("%s: element %d = %v, want %v", name, bad, got[bad], want[bad])
		record(name, math.Inf(1))
		return
	}
	rel := math.Sqrt(num)
	if den > 0 {
		rel /= math.Sqrt(den)
	}
	record(name, rel)
	if !(rel <= tol) {
		worst, at := 0.0, 0
		for i := range got {
			if d := math.Abs(float64(got[i] - want[i])); d > worst {
				worst, at = d, i
			}
		}
		e.t.Errorf("%s: relative error %.3g > %.0e (worst element %d: %v, want %v)", name, rel, tol, at, got[at], want[at])
	}
}

func record(name string, rel float64) {
	sumMu.Lock()
	defer sumMu.Unlock()
	if v, ok := summary[name]; !ok || rel > v || math.IsNaN(rel) {
		summary[name] = rel
	}
}

func tolFor(heavy bool, dts ...gpu.DType) float64 {
	for _, d := range dts {
		if d == gpu.BF16 || d == gpu.F16 {
			return tol16
		}
	}
	if heavy {
		return tolHeavy
	}
	return tolF32
}

var floatTypes = []gpu.DType{gpu.F32, gpu.BF16, gpu.F16}

func TestTransfers(t *testing.T) {
	e := newEnv(t)
	for _, dt := range floatTypes {
		g, c := e.in(dt, 1, 37, 5)
		e.compare("upload/download "+dt.String(), g, c, 0)
		raw := make([]byte, g.Bytes())
		if err := e.g.DownloadBytes(raw, g); err != nil {
			t.Fatal(err)
		}
		craw := make([]byte, c.Bytes())
		_ = e.c.DownloadBytes(craw, c)
		if string(raw) != string(craw) {
			t.Errorf("download bytes %v differ from the cpu backend's", dt)
		}
		g2, _ := e.out(dt, 37, 5)
		if err := e.g.UploadBytes(g2, raw); err != nil {
			t.Fatal(err)
		}
		e.compare("upload bytes "+dt.String(), g2, c, 0)
	}
	ids := e.randIDs(1001, 1<<30)
	gi, _ := e.ids(ids)
	back := make([]int32, len(ids))
	if err := e.g.DownloadI32(back, gi); err != nil {
		t.Fatal(err)
	}
	for i := range ids {
		if back[i] != ids[i] {
			t.Fatalf("i32 round trip: element %d = %d, want %d", i, back[i], ids[i])
		}
	}
}

func TestCopyFillZero(t *testing.T) {
	e := newEnv(t)
	types := append(append([]gpu.DType(nil), floatTypes...), gpu.I32)
	// 2100 elements take the scalar cast, 2104 the 8-wide one.
	for _, n := range []int{2100, 2104} {
		for _, sdt := range types {
			for _, ddt := range types {
				gs, cs := e.alloc(sdt, n)
				vals := e.randn(gs.Numel(), 1000, gpu.F32)
				if sdt != gpu.I32 {
					for i := range vals {
						vals[i] = gpu.Round(sdt, vals[i]/100)
					}
				}
				e.set(gs, cs, vals)
				gd, cd := e.out(ddt, n)
				e.check("copy", e.g.Copy(gd, gs), e.c.Copy(cd, cs))
				e.compare(fmt.Sprintf("copy %v->%v", sdt, ddt), gd, cd, 0)
			}
		}
	}
	// Pinned host memory on either side, with and without a cast.
	pm, err := e.g.AllocHost(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := e.g.Free(pm); err != nil {
			t.Error(err)
		}
	}()
	if _, ok := pm.(gpu.HostMemory); !ok {
		t.Fatalf("pinned memory %T is not gpu.HostMemory", pm)
	}
	gs, cs := e.in(gpu.F32, 1, 1000)
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
		ph, _ := gpu.NewTensor(pm, 0, dt, 1000)
		if err := e.g.Copy(ph, gs); err != nil {
			t.Fatal(err)
		}
		gd, _ := e.out(gpu.F32, 1000)
		if err := e.g.Copy(gd, ph); err != nil {
			t.Fatal(err)
		}
		cd, _ := e.c.Alloc(4000)
		ct, _ := gpu.NewTensor(cd, 0, gpu.F32, 1000)
		ctmp, _ := e.c.Alloc(4000)
		ctt, _ := gpu.NewTensor(ctmp, 0, dt, 1000)
		_ = e.c.Copy(ctt, cs)
		_ = e.c.Copy(ct, ctt)
		e.compare("copy via pinned "+dt.String(), gd, ct, 0)
		// The host sees the pinned bytes directly.
		hb, err := ph.HostBytes()
		if err != nil {
			t.Fatal(err)
		}
		want := make([]float32, 1000)
		got := make([]float32, 1000)
		_ = e.c.Download(want, ctt)
		if err := e.g.Sync(); err != nil {
			t.Fatal(err)
		}
		_ = gpu.DecodeF32(got, hb, dt)
		e.compareVals("pinned host bytes "+dt.String(), got, want, 0)
	}
	for _, dt := range types {
		g, c := e.out(dt, 333)
		e.check("fill", e.g.Fill(g, -1.7), e.c.Fill(c, -1.7))
		e.compare("fill "+dt.String(), g, c, 0)
		e.check("zero", e.g.Zero(g), e.c.Zero(c))
		e.compare("zero "+dt.String(), g, c, 0)
	}
	g, c := e.out(gpu.BF16, 3) // 6 bytes: the 16-bit zero path.
	e.check("zero", e.g.Zero(g), e.c.Zero(c))
	e.compare("zero bf16 odd", g, c, 0)
}

func TestElementwise(t *testing.T) {
	e := newEnv(t)
	for _, dt := range floatTypes {
		// {129,77} runs the scalar kernels, {129,80} the 8-wide ones.
		for _, shape := range [][]int{{129, 77}, {129, 80}} {
			for _, odt := range []gpu.DType{dt, gpu.F32} {
				tol := tolFor(false, dt, odt)
				ga, ca := e.in(dt, 1, shape...)
				gb, cb := e.in(odt, 1, shape...)
				gd, cd := e.out(odt, shape...)
				e.check("add", e.g.Add(gd, ga, gb), e.c.Add(cd, ca, cb))
				e.compare(fmt.Sprintf("add %v+%v->%v", dt, odt, odt), gd, cd, tol)
				e.check("add in place", e.g.Add(gb, ga, gb), e.c.Add(cb, ca, cb))
				e.compare("add in place "+odt.String(), gb, cb, tol)
				e.check("scale", e.g.Scale(ga, 0.37), e.c.Scale(ca, 0.37))
				e.compare("scale "+dt.String(), ga, ca, tol)
				e.check("addscaled", e.g.AddScaled(gb, ga, -1.3), e.c.AddScaled(cb, ca, -1.3))
				e.compare(fmt.Sprintf("addscaled %v+=%v", odt, dt), gb, cb, tol)

				gg, cg := e.in(dt, 2, shape...)
				gu, cu := e.in(dt, 1, shape...)
				go_, co := e.out(odt, shape...)
				e.check("swiglu", e.g.SwiGLU(go_, gg, gu), e.c.SwiGLU(co, cg, cu))
				e.compare(fmt.Sprintf("swiglu %v->%v", dt, odt), go_, co, tol)
				gdo, cdo := e.in(odt, 1, shape...)
				gdg, cdg := e.out(dt, shape...)
				gdu, cdu := e.out(odt, shape...)
				e.check("swiglu backward", e.g.SwiGLUBackward(gdg, gdu, gdo, gg, gu), e.c.SwiGLUBackward(cdg, cdu, cdo, cg, cu))
				e.compare("swiglu backward dGate "+dt.String(), gdg, cdg, tol)
				e.compare("swiglu backward dUp "+dt.String(), gdu, cdu, tol)
				// dGate aliasing dOut.
				gdo2, cdo2 := e.in(dt, 1, shape...)
				gdu2, cdu2 := e.out(dt, shape...)
				e.check("swiglu backward in place", e.g.SwiGLUBackward(gdo2, gdu2, gdo2, gg, gu), e.c.SwiGLUBackward(cdo2, cdu2, cdo2, cg, cu))
				e.compare("swiglu backward in place "+dt.String(), gdo2, cdo2, tol)

				gy, cy := e.in(dt, 1, shape...)
				gbias, cbias := e.in(odt, 1, shape[1])
				e.check("addbias", e.g.AddBias(gy, gbias), e.c.AddBias(cy, cbias))
				e.compare(fmt.Sprintf("addbias %v+%v", dt, odt), gy, cy, tol)
				gdb, cdb := e.in(odt, 1, shape[1])
				e.check("biasgrad", e.g.BiasGrad(gdb, gy), e.c.BiasGrad(cdb, cy))
				e.compare(fmt.Sprintf("biasgrad %v<-%v", odt, dt), gdb, cdb, tol)
			}
		}
	}
	// Bias gradients over many rows: several blocks of rows, rows left
	// over after the four-row steps, and a partial tile of column groups
	// (264 = 33 groups of 8).
	for _, shape := range [][]int{{3001, 264}, {16384, 256}, {777, 1536}} {
		gy, cy := e.in(gpu.BF16, 1, shape...)
		gdb, cdb := e.in(gpu.F32, 1, shape[1])
		e.check("biasgrad", e.g.BiasGrad(gdb, gy), e.c.BiasGrad(cdb, cy))
		e.compare(fmt.Sprintf("biasgrad f32<-bf16 %v", shape), gdb, cdb, tolF32)
	}
	// A view 4 elements into its buffer is not 16-byte aligned for 16-bit
	// dtypes: the scalar kernels run though n is a multiple of 8.
	gbig, cbig := e.in(gpu.BF16, 1, 1032)
	gv, _ := gbig.Flat(4, 1028)
	cv, _ := cbig.Flat(4, 1028)
	gw, cw := e.in(gpu.BF16, 1, 1024)
	e.check("add unaligned", e.g.Add(gv, gv, gw), e.c.Add(cv, cv, cw))
	e.compare("add unaligned view", gbig, cbig, tolFor(false, gpu.BF16))
}

// mustFlat is x.Flat(lo, hi), failing t on an error.
func mustFlat(t *testing.T, x gpu.Tensor, lo, hi int) gpu.Tensor {
	t.Helper()
	v, err := x.Flat(lo, hi)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestAdamWAndSumSquares(t *testing.T) {
	e := newEnv(t)
	n := 100003
	gp, cp := e.in(gpu.F32, 1, n)
	gg, cg := e.in(gpu.F32, 0.1, n)
	gm, cm := e.in(gpu.F32, 0.01, n)
	gv, cv := e.alloc(gpu.F32, n)
	vals := e.randn(n, 0.001, gpu.F32)
	for i := range vals {
		vals[i] *= vals[i]
	}
	e.set(gv, cv, vals)
	for step := 1; step <= 3; step++ {
		for _, b1 := range []float64{0.9, 0.3} {
			// The grad scale is 1 (exact) or a clip coefficient.
			st := gpu.AdamWStep{LR: 1e-3, Beta1: b1, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: step, GradScale: []float32{0, 0.37}[step%2]}
			e.check("adamw", e.g.AdamW(gp, gg, gm, gv, st), e.c.AdamW(cp, cg, cm, cv, st))
		}
	}
	e.compare("adamw p", gp, cp, tolF32)
	e.compare("adamw m", gm, cm, tolF32)
	e.compare("adamw v", gv, cv, tolF32)
	// n above is odd: k_adamw. A multiple of 4 at 16-byte aligned
	// addresses takes k_adamw4, the same views one float into their
	// buffers k_adamw: the same bits.
	n4 := 4096*3 + 4
	var vec, sca [4]gpu.Tensor
	for k, sc := range []float64{1, 0.1, 0.01, 0.001} {
		vals := e.randn(n4, sc, gpu.F32)
		if k == 3 {
			for i := range vals {
				vals[i] *= vals[i]
			}
		}
		a, _ := e.alloc(gpu.F32, n4+1)
		u, _ := e.alloc(gpu.F32, n4+1)
		vec[k], sca[k] = mustFlat(t, a, 0, n4), mustFlat(t, u, 1, n4+1)
		for _, x := range []gpu.Tensor{vec[k], sca[k]} {
			if err := e.g.Upload(x, vals); err != nil {
				t.Fatal(err)
			}
		}
	}
	for step := 1; step <= 2; step++ {
		st := gpu.AdamWStep{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: step, GradScale: 0.37}
		if err := e.g.AdamW(vec[0], vec[1], vec[2], vec[3], st); err != nil {
			t.Fatal(err)
		}
		if err := e.g.AdamW(sca[0], sca[1], sca[2], sca[3], st); err != nil {
			t.Fatal(err)
		}
	}
	for k, nm := range []string{"p", "g", "m", "v"} {
		e.sameBits("adamw 4-wide against scalar "+nm, vec[k], sca[k])
	}
	// 16-bit grads (k_adamw4_16, and k_adamw on a view one element in)
	// give the bits of float32 grads of the same values (k_adamw4).
	for _, gd := range []gpu.DType{gpu.BF16, gpu.F16} {
		for _, lo := range []int{0, 1} {
			gvals := e.randn(n4, 0.1, gd)
			var f32, h16 [4]gpu.Tensor
			for k := range f32 {
				f32[k], _ = e.alloc(gpu.F32, n4)
				h16[k], _ = e.alloc(gpu.F32, n4)
				if k == 1 {
					g16, _ := e.alloc(gd, n4+1)
					h16[k] = mustFlat(t, g16, lo, n4+lo)
				}
				if err := e.g.Copy(f32[k], vec[k]); err != nil {
					t.Fatal(err)
				}
				if err := e.g.Copy(h16[k], vec[k]); err != nil {
					t.Fatal(err)
				}
			}
			for _, x := range []gpu.Tensor{f32[1], h16[1]} {
				if err := e.g.Upload(x, gvals); err != nil {
					t.Fatal(err)
				}
			}
			st := gpu.AdamWStep{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: 3, GradScale: 0.37}
			for _, x := range [][4]gpu.Tensor{f32, h16} {
				if err := e.g.AdamW(x[0], x[1], x[2], x[3], st); err != nil {
					t.Fatal(err)
				}
			}
			for _, k := range []int{0, 2, 3} {
				e.sameBits(fmt.Sprintf("adamw %v grads at element %d, %s", gd, lo, "pgmv"[k:k+1]), h16[k], f32[k])
			}
		}
	}
	for _, dt := range floatTypes {
		gx, cx := e.in(dt, 3, 77, 1001)
		// k_sumsq8 with a tail of 5 elements, k_sumsq on a view 1 element
		// in, and k_sumsq8 on 8-element groups only.
		for _, c := range []struct {
			name   string
			lo, hi int
		}{{"", 0, 77 * 1001}, {" unaligned", 1, 77 * 1001}, {" groups", 0, 77 * 1000}} {
			g, cv := mustFlat(t, gx, c.lo, c.hi), mustFlat(t, cx, c.lo, c.hi)
			got, err := e.g.SumSquares(g)
			want, err2 := e.c.SumSquares(cv)
			e.check("sumsquares", err, err2)
			rel := math.Abs(got-want) / want
			record("sumsquares "+dt.String()+c.name, rel)
			if !(rel <= 1e-12) {
				t.Errorf("sumsquares %v%s: %v, want %v (rel %.3g)", dt, c.name, got, want, rel)
			}
		}
		// SumSquaresTo leaves the same float64 in device memory, without
		// waiting; an empty tensor's sum is 0.
		for _, x := range []gpu.Tensor{gx, {}} {
			if x.Mem == nil {
				x, _ = e.in(dt, 3, 0)
			}
			ref, err := e.g.SumSquares(x)
			if err != nil {
				t.Fatal(err)
			}
			dst, _ := e.alloc(gpu.I32, 2)
			if err := e.g.SumSquaresTo(dst, x); err != nil {
				t.Fatal(err)
			}
			raw := make([]byte, 8)
			if err := e.g.DownloadBytes(raw, dst); err != nil {
				t.Fatal(err)
			}
			if got := math.Float64frombits(binary.LittleEndian.Uint64(raw)); got != ref {
				t.Errorf("sumsquares to device %v (%d elements): %v, want %v", dt, x.Numel(), got, ref)
			}
		}
	}
}

func TestEmbedding(t *testing.T) {
	e := newEnv(t)
	for _, dt := range floatTypes {
		v, h, n := 301, 96, 517
		gt, ct := e.in(dt, 1, v, h)
		ids := e.randIDs(n, 40) // many repeats
		gi, ci := e.ids(ids)
		gd, cd := e.out(dt, n, h)
		e.check("embedding", e.g.Embedding(gd, gt, gi), e.c.Embedding(cd, ct, ci))
		e.compare("embedding "+dt.String(), gd, cd, 0)
		gi2, ci2 := e.ids(e.randIDs(n, v)) // mostly distinct ids
		for _, tdt := range []gpu.DType{dt, gpu.F32} {
			for _, p := range [][2]gpu.Tensor{{gi, ci}, {gi2, ci2}} {
				gdt, cdt := e.in(tdt, 1, v, h)
				gdy, cdy := e.in(dt, 1, n, h)
				e.check("embedding backward", e.g.EmbeddingBackward(gdt, gdy, p[0]), e.c.EmbeddingBackward(cdt, cdy, p[1]))
				e.compare(fmt.Sprintf("embedding backward %v<-%v", tdt, dt), gdt, cdt, tolFor(false, tdt))
			}
		}
	}
	// Several spans of 1024 tokens and a partial block of columns: each
	// id's rows add in token order, so the sums equal the CPU's bit for
	// bit, in bf16 and f32 tables.
	for _, tdt := range []gpu.DType{gpu.BF16, gpu.F32} {
		v, h, n := 301, 200, 2600
		gi, ci := e.ids(e.randIDs(n, v))
		gdt, cdt := e.in(tdt, 1, v, h)
		gdy, cdy := e.in(gpu.BF16, 1, n, h)
		e.check("embedding backward", e.g.EmbeddingBackward(gdt, gdy, gi), e.c.EmbeddingBackward(cdt, cdy, ci))
		e.compare(fmt.Sprintf("embedding backward %v<-bf16, %d tokens", tdt, n), gdt, cdt, 0)
	}
	// A bad id is reported by the next Sync.
	gt, _ := e.in(gpu.F32, 1, 10, 4)
	gi, _ := e.ids([]int32{1, 10})
	gd, _ := e.out(gpu.F32, 2, 4)
	if err := e.g.Embedding(gd, gt, gi); err != nil {
		t.Fatal(err)
	}
	if err := e.g.Sync(); err == nil || !strings.Contains(err.Error(), "embedding") {
		t.Errorf("sync after a bad id: %v, want an embedding error", err)
	}
	if err := e.g.Sync(); err != nil {
		t.Errorf("the error flag was not cleared: %v", err)
	}
	// So is a bad id in the backward, whose row is skipped.
	gdt, cdt := e.in(gpu.F32, 1, 10, 4)
	vals := e.randn(12, 1, gpu.F32)
	gdy, _ := e.alloc(gpu.F32, 3, 4)
	_, cdy := e.alloc(gpu.F32, 2, 4) // the CPU side without the bad row
	gbi, _ := e.ids([]int32{2, -1, 2})
	_, cbi := e.ids([]int32{2, 2})
	if err := e.g.Upload(gdy, vals); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Upload(cdy, append(vals[0:4:4], vals[8:12]...)); err != nil {
		t.Fatal(err)
	}
	if err := e.g.EmbeddingBackward(gdt, gdy, gbi); err != nil {
		t.Fatal(err)
	}
	if err := e.g.Sync(); err == nil || !strings.Contains(err.Error(), "embedding") {
		t.Errorf("sync after a bad id in the backward: %v, want an embedding error", err)
	}
	if err := e.c.EmbeddingBackward(cdt, cdy, cbi); err != nil {
		t.Fatal(err)
	}
	e.compare("embedding backward, a bad id skipped", gdt, cdt, 0)
}

func TestRMSNorm(t *testing.T) {
	e := newEnv(t)
	for _, dt := range floatTypes {
		// h 36 and 9000 take the scalar kernels; 64, 128 and 256 the 8-wide
		// warp-per-row ones; 1000 and 1536 the 8-wide block-per-row ones
		// with one column group per thread, 5120 with two. 700 rows of 1536
		// and 3000 of 128 spread over hundreds of blocks whose dw sums are
		// reduced.
		for _, c := range []struct{ rows, h int }{{67, 64}, {3000, 128}, {67, 256}, {67, 1000}, {67, 36}, {700, 1536}, {67, 5120}, {5, 9000}} {
			rows, h := c.rows, c.h
			tol := tolFor(false, dt)
			gx, cx := e.in(dt, 2, rows, h)
			gw, cw := e.in(dt, 1, h)
			gd, cd := e.out(dt, rows, h)
			gr, cr := e.out(gpu.F32, rows)
			e.check("rmsnorm", e.g.RMSNorm(gd, gr, gx, gw, 1e-6), e.c.RMSNorm(cd, cr, cx, cw, 1e-6))
			e.compare(fmt.Sprintf("rmsnorm %v", dt), gd, cd, tol)
			e.compare("rmsnorm rstd "+dt.String(), gr, cr, tolF32)
			gdy, cdy := e.in(dt, 1, rows, h)
			gdx, cdx := e.out(dt, rows, h)
			gdw, cdw := e.in(gpu.F32, 1, h)
			e.check("rmsnorm backward", e.g.RMSNormBackward(gdx, gdw, gdy, gx, gw, gr), e.c.RMSNormBackward(cdx, cdw, cdy, cx, cw, cr))
			e.compare("rmsnorm backward dx "+dt.String(), gdx, cdx, tol)
			e.compare("rmsnorm backward dw "+dt.String(), gdw, cdw, tolF32)
			// dx aliasing dy, no dw; dst aliasing x.
			e.check("rmsnorm backward in place", e.g.RMSNormBackward(gdy, gpu.Tensor{}, gdy, gx, gw, gr), e.c.RMSNormBackward(cdy, gpu.Tensor{}, cdy, cx, cw, cr))
			e.compare("rmsnorm backward in place "+dt.String(), gdy, cdy, tol)
			e.check("rmsnorm in place", e.g.RMSNorm(gx, gr, gx, gw, 1e-5), e.c.RMSNorm(cx, cr, cx, cw, 1e-5))
			e.compare("rmsnorm in place "+dt.String(), gx, cx, tol)
		}
	}
}

// TestFusedNorms checks AddRMSNorm and RMSNormBackwardAdd: bit for bit
// against their steps (gpu.AddRMSNormSteps, gpu.RMSNormBackwardAddSteps)
// on the GPU, on the shapes the fused kernels take (rows of 1000, 1024,
// 1536, 4104 and 5120 values; with 1200 and 1060 rows a block of the
// backward takes three rows on a GPU of up to 132 SMs, loading each next
// row ahead for the one-group kernel) and on those that run the steps
// (64, 36), and against the CPU backend within the dtype's tolerance.
func TestFusedNorms(t *testing.T) {
	e := newEnv(t)
	same := e.sameBits
	dup := func(g gpu.Tensor) gpu.Tensor {
		t.Helper()
		d, _ := e.alloc(g.DType, g.Shape...)
		if err := e.g.Copy(d, g); err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, dt := range floatTypes {
		for _, c := range []struct{ rows, h int }{{67, 1000}, {700, 1536}, {1200, 1024}, {67, 5120}, {1060, 4104}, {67, 64}, {5, 36}} {
			e.off = 0 // the previous case's buffers are dead
			rows, h := c.rows, c.h
			name := fmt.Sprintf("%v %dx%d", dt, rows, h)
			tol := tolFor(false, dt)
			ga, ca := e.in(gpu.F32, 2, rows, h)
			gb, cb := e.in(dt, 1, rows, h)
			gw, cw := e.in(dt, 1, h)
			gs, cs := e.out(gpu.F32, rows, h)
			gd, cd := e.out(dt, rows, h)
			gr, cr := e.out(gpu.F32, rows)
			e.check("add rmsnorm", e.g.AddRMSNorm(gs, gd, gr, ga, gb, gw, 1e-6), e.c.AddRMSNorm(cs, cd, cr, ca, cb, cw, 1e-6))
			e.compare("add rmsnorm sum "+name, gs, cs, tolF32)
			e.compare("add rmsnorm "+name, gd, cd, tol)
			s2, d2, r2 := dup(gs), dup(gd), dup(gr)
			if err := gpu.AddRMSNormSteps(e.g, s2, d2, r2, ga, gb, gw, 1e-6); err != nil {
				t.Fatal(err)
			}
			same("add rmsnorm sum "+name, gs, s2)
			same("add rmsnorm "+name, gd, d2)
			same("add rmsnorm rstd "+name, gr, r2)

			for _, withCast := range []bool{true, false} {
				gacc, cacc := e.in(gpu.F32, 1, rows, h)
				gdy, cdy := e.in(dt, 1, rows, h)
				gdw, cdw := e.in(gpu.F32, 1, h)
				var gc, cc gpu.Tensor
				if withCast {
					gc, cc = e.out(gpu.BF16, rows, h)
				}
				acc2, dy2, dw2 := dup(gacc), dup(gdy), dup(gdw)
				var c2 gpu.Tensor
				if withCast {
					c2 = dup(gc)
				}
				e.check("rmsnorm backward add", e.g.RMSNormBackwardAdd(gacc, gc, gdw, gdy, gs, gw, gr), e.c.RMSNormBackwardAdd(cacc, cc, cdw, cdy, cs, cw, cr))
				e.compare("rmsnorm backward add acc "+name, gacc, cacc, tol)
				e.compare("rmsnorm backward add dw "+name, gdw, cdw, tolF32)
				if err := gpu.RMSNormBackwardAddSteps(e.g, acc2, c2, dw2, dy2, gs, gw, gr); err != nil {
					t.Fatal(err)
				}
				same("rmsnorm backward add acc "+name, gacc, acc2)
				same("rmsnorm backward add dw "+name, gdw, dw2)
				if withCast {
					e.compare("rmsnorm backward add cast "+name, gc, cc, tolFor(false, gpu.BF16))
					same("rmsnorm backward add cast "+name, gc, c2)
				}
			}
		}
	}
}

// TestRMSNormF32Rows checks RMSNorm of float32 rows into bf16 or f16, as
// the decoder's norms of the residual stream run (the warp-per-row
// k_rmsnorm_r4, _r8, _r8 and _r16 for rows of 1000, 1536, 2048 and 3584
// values, k_rmsnorm8 for 5120), against the CPU.
func TestRMSNormF32Rows(t *testing.T) {
	e := newEnv(t)
	for _, dt := range []gpu.DType{gpu.BF16, gpu.F16} {
		for _, c := range []struct{ rows, h int }{{67, 1000}, {700, 1536}, {300, 2048}, {67, 3584}, {67, 5120}} {
			e.off = 0
			name := fmt.Sprintf("%v %dx%d", dt, c.rows, c.h)
			gx, cx := e.in(gpu.F32, 2, c.rows, c.h)
			gw, cw := e.in(dt, 1, c.h)
			gd, cd := e.out(dt, c.rows, c.h)
			gr, cr := e.out(gpu.F32, c.rows)
			e.check("rmsnorm "+name, e.g.RMSNorm(gd, gr, gx, gw, 1e-6), e.c.RMSNorm(cd, cr, cx, cw, 1e-6))
			e.compare("rmsnorm "+name, gd, cd, tolFor(false, dt))
			e.compare("rmsnorm rstd "+name, gr, cr, tolF32)
		}
	}
}

// TestAddRMSNorm16 checks AddRMSNorm with every operand of one 16-bit
// dtype (k_add_rmsnorm8) against the CPU, with sum a buffer of its own and
// sum in place over a.
func TestAddRMSNorm16(t *testing.T) {
	e := newEnv(t)
	for _, dt := range []gpu.DType{gpu.BF16, gpu.F16} {
		for _, c := range []struct{ rows, h int }{{67, 1000}, {700, 1536}, {300, 2048}, {67, 3584}, {67, 5120}} {
			for _, inPlace := range []bool{false, true} {
				e.off = 0
				name := fmt.Sprintf("%v %dx%d in place %v", dt, c.rows, c.h, inPlace)
				ga, ca := e.in(dt, 2, c.rows, c.h)
				gb, cb := e.in(dt, 1, c.rows, c.h)
				gw, cw := e.in(dt, 1, c.h)
				gs, cs := ga, ca
				if !inPlace {
					gs, cs = e.out(dt, c.rows, c.h)
				}
				gd, cd := e.out(dt, c.rows, c.h)
				gr, cr := e.out(gpu.F32, c.rows)
				e.check("add rmsnorm "+name, e.g.AddRMSNorm(gs, gd, gr, ga, gb, gw, 1e-6), e.c.AddRMSNorm(cs, cd, cr, ca, cb, cw, 1e-6))
				e.compare("add rmsnorm sum "+name, gs, cs, tolFor(false, dt))
				e.compare("add rmsnorm "+name, gd, cd, tolFor(false, dt))
				e.compare("add rmsnorm rstd "+name, gr, cr, tolF32)
			}
		}
	}
}

func TestRoPE(t *testing.T) {
	e := newEnv(t)
	llama3 := &gpu.RoPEScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}
	for _, dt := range floatTypes {
		for _, sc := range []*gpu.RoPEScaling{nil, llama3, {Type: "linear", Factor: 2}} {
			// Head dims that are multiples of 16 take k_rope8 (several
			// tokens a block, the last block partial), 40 takes k_rope.
			for _, d := range []int{40, 64, 96, 128} {
				n, heads := 53, 6
				pos := e.randIDs(n, 20000)
				gp, cp := e.ids(pos)
				gx, cx := e.in(dt, 1, n, heads, d)
				name := "default"
				if sc != nil {
					name = sc.Type
				}
				e.check("rope", e.g.RoPE(gx, gp, 500000, sc), e.c.RoPE(cx, cp, 500000, sc))
				e.compare(fmt.Sprintf("rope %s %v", name, dt), gx, cx, tolFor(false, dt))
				e.check("rope backward", e.g.RoPEBackward(gx, gp, 500000, sc), e.c.RoPEBackward(cx, cp, 500000, sc))
				e.compare(fmt.Sprintf("rope backward %s %v", name, dt), gx, cx, tolFor(false, dt))
			}
		}
	}
}

func TestGemm(t *testing.T) {
	e := newEnv(t)
	type combo struct{ a, b, c gpu.DType }
	combos := []combo{
		{gpu.F32, gpu.F32, gpu.F32}, {gpu.BF16, gpu.BF16, gpu.BF16}, {gpu.BF16, gpu.BF16, gpu.F32},
		{gpu.F16, gpu.F16, gpu.F16}, {gpu.F32, gpu.BF16, gpu.F32}, {gpu.BF16, gpu.F32, gpu.BF16}, {gpu.BF16, gpu.BF16, gpu.F16},
	}
	m, k, n := 131, 200, 97
	for _, cb := range combos {
		for _, ta := range []bool{false, true} {
			for _, tb := range []bool{false, true} {
				ash := []int{m, k}
				if ta {
					ash = []int{k, m}
				}
				bsh := []int{k, n}
				if tb {
					bsh = []int{n, k}
				}
				ga, ca := e.in(cb.a, 1, ash...)
				gb, cbm := e.in(cb.b, 1, bsh...)
				gc, cc := e.in(cb.c, 1, m, n)
				name := fmt.Sprintf("gemm %v@%v->%v", cb.a, cb.b, cb.c)
				e.check(name, e.g.Gemm(gc, ga, gb, ta, tb, 0.7, 0.3), e.c.Gemm(cc, ca, cbm, ta, tb, 0.7, 0.3))
				e.compare(name+" beta", gc, cc, tolFor(true, cb.a, cb.b, cb.c))
				gc2, cc2 := e.out(cb.c, m, n)
				e.check(name, e.g.Gemm(gc2, ga, gb, ta, tb, 1, 0), e.c.Gemm(cc2, ca, cbm, ta, tb, 1, 0))
				e.compare(name, gc2, cc2, tolFor(true, cb.a, cb.b, cb.c))
			}
		}
	}
	// A larger float32 product: TF32 would show here as ~1e-3.
	ga, ca := e.in(gpu.F32, 1, 512, 1024)
	gb, cb := e.in(gpu.F32, 1, 768, 1024)
	gc, cc := e.out(gpu.F32, 512, 768)
	e.check("gemm large", e.g.Gemm(gc, ga, gb, false, true, 1, 0), e.c.Gemm(cc, ca, cb, false, true, 1, 0))
	e.compare("gemm f32 512x768x1024 (no tf32)", gc, cc, tolHeavy)
}

// packed returns cuSeqlens for the given sequence lengths.
func packed(lens ...int) []int32 {
	cu := []int32{0}
	for _, l := range lens {
		cu = append(cu, cu[len(cu)-1]+int32(l))
	}
	return cu
}

func TestAttention(t *testing.T) {
	e := newEnv(t)
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
		for _, cfg := range []struct {
			lens       []int
			hq, hkv, d int
		}{
			{[]int{70, 129, 5}, 8, 2, 64},
			{[]int{33, 1, 100}, 4, 4, 128},
			{[]int{17, 40, 23}, 6, 1, 96},
			{[]int{5, 0, 64, 0}, 4, 2, 32}, // empty sequences
		} {
			name := fmt.Sprintf("attention %v seqs%v hq%d hkv%d d%d", dt, cfg.lens, cfg.hq, cfg.hkv, cfg.d)
			e.compareAttention(name, dt, cfg.lens, cfg.hq, cfg.hkv, cfg.d, tolFor(true, dt), tolHeavy)
		}
	}
}

// attnRun is the CUDA side of one attention comparison.
type attnRun struct {
	q, k, v, cu, out, lse, dout, dq, dk, dv gpu.Tensor
	scale                                   float32
}

// compareAttention runs Attention and AttentionBackward on both backends
// for packed sequences of lengths lens (hq query and hkv kv heads of dim d)
// and compares the results: out, dq, dk and dv within tol, lse within
// tolLSE. The backward reads the CPU's own forward results on both sides.
func (e *env) compareAttention(name string, dt gpu.DType, lens []int, hq, hkv, d int, tol, tolLSE float64) attnRun {
	e.t.Helper()
	cu := packed(lens...)
	n := int(cu[len(cu)-1])
	var r attnRun
	var ccu, cq, ck, cv, cout, clse, cdo, cdq, cdk, cdv gpu.Tensor
	r.cu, ccu = e.ids(cu)
	r.q, cq = e.in(dt, 1, n, hq, d)
	r.k, ck = e.in(dt, 1, n, hkv, d)
	r.v, cv = e.in(dt, 1, n, hkv, d)
	r.out, cout = e.out(dt, n, hq, d)
	r.lse, clse = e.out(gpu.F32, hq, n)
	r.scale = float32(1 / math.Sqrt(float64(d)))
	e.check(name, e.g.Attention(r.out, r.lse, r.q, r.k, r.v, r.cu, r.scale), e.c.Attention(cout, clse, cq, ck, cv, ccu, r.scale))
	e.compare(name+" out", r.out, cout, tol)
	e.compare(name+" lse", r.lse, clse, tolLSE)
	e.copyCPU(r.out, cout)
	e.copyCPU(r.lse, clse)
	r.dout, cdo = e.in(dt, 1, n, hq, d)
	r.dq, cdq = e.out(dt, n, hq, d)
	r.dk, cdk = e.out(dt, n, hkv, d)
	r.dv, cdv = e.out(dt, n, hkv, d)
	e.check(name+" backward", e.g.AttentionBackward(r.dq, r.dk, r.dv, r.dout, r.out, r.lse, r.q, r.k, r.v, r.cu, r.scale),
		e.c.AttentionBackward(cdq, cdk, cdv, cdo, cout, clse, cq, ck, cv, ccu, r.scale))
	e.compare(name+" dq", r.dq, cdq, tol)
	e.compare(name+" dk", r.dk, cdk, tol)
	e.compare(name+" dv", r.dv, cdv, tol)
	return r
}

// sameBits fails the test unless GPU tensors a and b hold the same bytes
// (name says what the two are).
func (e *env) sameBits(name string, a, b gpu.Tensor) {
	e.t.Helper()
	x, y := make([]byte, a.Bytes()), make([]byte, b.Bytes())
	if err := e.g.DownloadBytes(x, a); err != nil {
		e.t.Fatal(err)
	}
	if err := e.g.DownloadBytes(y, b); err != nil {
		e.t.Fatal(err)
	}
	if !bytes.Equal(x, y) {
		e.t.Errorf("%s: not the same bytes", name)
	}
}

// copyCPU uploads the CPU tensor's contents into the CUDA one.
func (e *env) copyCPU(g, c gpu.Tensor) {
	e.t.Helper()
	raw := make([]byte, c.Bytes())
	if err := e.c.DownloadBytes(raw, c); err != nil {
		e.t.Fatal(err)
	}
	if err := e.g.UploadBytes(g, raw); err != nil {
		e.t.Fatal(err)
	}
}

// TestCopyRows copies listed rows (with repeats) between device tensors
// in 16-byte words and at odd widths byte by byte, and into pinned host
// memory, as the CPU does; a bad row is reported by the next Sync.
func TestCopyRows(t *testing.T) {
	e := newEnv(t)
	const v = 301
	rows := append(e.randIDs(200, v), 3, 3, 0, v-1)
	gr, cr := e.ids(rows)
	for _, c := range []struct {
		dt gpu.DType
		h  int
	}{{gpu.F32, 96}, {gpu.BF16, 5}, {gpu.BF16, 64}} {
		gs, cs := e.in(c.dt, 1, v, c.h)
		gd, cd := e.in(c.dt, 1, v, c.h)
		e.check("copy rows", e.g.CopyRows(gd, gs, gr), e.c.CopyRows(cd, cs, cr))
		e.compare(fmt.Sprintf("copy rows %v h %d", c.dt, c.h), gd, cd, 0)
	}
	pm, err := e.g.AllocHost(v * 96 * 4)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := e.g.Free(pm); err != nil {
			t.Error(err)
		}
	}()
	ph, _ := gpu.NewTensor(pm, 0, gpu.F32, v, 96)
	gs, cs := e.in(gpu.F32, 1, v, 96)
	old := e.randn(v*96, 1, gpu.F32)
	gd, cd := e.alloc(gpu.F32, v, 96)
	e.set(gd, cd, old)
	if err := e.g.Copy(ph, gd); err != nil {
		t.Fatal(err)
	}
	e.check("copy rows to host", e.g.CopyRows(ph, gs, gr), e.c.CopyRows(cd, cs, cr))
	if err := e.g.Sync(); err != nil {
		t.Fatal(err)
	}
	got, want := make([]float32, v*96), make([]float32, v*96)
	if err := e.g.Download(got, ph); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Download(want, cd); err != nil {
		t.Fatal(err)
	}
	e.compareVals("copy rows into pinned host memory", got, want, 0)

	gb, _ := e.ids([]int32{1, v})
	if err := e.g.CopyRows(gd, gs, gb); err != nil {
		t.Fatal(err)
	}
	if err := e.g.Sync(); err == nil || !strings.Contains(err.Error(), "copy rows") {
		t.Errorf("sync after a bad row: %v, want a copy rows error", err)
	}
	if err := e.g.Sync(); err != nil {
		t.Errorf("the error flag was not cleared: %v", err)
	}
}

// TestLogProbs holds LogProbs and LogProbsBackward to the CPU's, with
// LogProbs' one-kernel form on Hopper (lpHeadStore) where it takes the
// operands; TestLogProbsStoreOff runs the same with cuBLASLt's product and
// k_lp_fwd throughout.
func TestLogProbs(t *testing.T) {
	withStore(t, false)
	testLogProbs(t)
}

// TestLogProbsStoreOff is TestLogProbs under RLPIPE_CUDA_LP_STORE=0.
func TestLogProbsStoreOff(t *testing.T) {
	withStore(t, true)
	testLogProbs(t)
}

func testLogProbs(t *testing.T) {
	e := newEnv(t)
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
		// v = 1000 and 20008 take the 16-byte backward (k_lp_bwd8), the
		// latter over three chunks of a 512-thread block, so that a 16-bit
		// chunk's writes land on values that earlier chunks read; v = 1003
		// takes the scalar one and unaligned rows.
		for _, cfg := range []struct {
			temp     float32
			tempered bool
			entropy  bool
			v        int
		}{{1, false, true, 1000}, {0.7, false, true, 1000}, {0.7, true, true, 1000}, {1.3, false, false, 1000},
			{1, false, true, 20008}, {0.7, true, true, 1003}} {
			c, h, v := 37, 64, cfg.v
			name := fmt.Sprintf("logprobs %v T=%v tempered=%v entropy=%v v=%d", dt, cfg.temp, cfg.tempered, cfg.entropy, v)
			gh, ch := e.in(dt, 1, c, h)
			gw, cw := e.in(dt, 0.3, v, h)
			tg := e.randIDs(c, v)
			gtg, ctg := e.ids(tg)
			glog, clog := e.out(gpu.F32, c, v)
			glp, clp := e.out(gpu.F32, c)
			var gent, cent gpu.Tensor
			if cfg.entropy {
				gent, cent = e.out(gpu.F32, c)
			}
			e.check(name, e.g.LogProbs(glp, gent, gh, gw, gtg, cfg.temp, cfg.tempered, glog, gpu.Tensor{}),
				e.c.LogProbs(clp, cent, ch, cw, ctg, cfg.temp, cfg.tempered, clog, gpu.Tensor{}))
			e.compare(name+" logits", glog, clog, tolHeavy)
			e.compare(name+" logp", glp, clp, tolHeavy)
			if cfg.entropy {
				e.compare(name+" entropy", gent, cent, tolHeavy)
			}
			gdlp, cdlp := e.in(gpu.F32, 1, c)
			var gde, cde gpu.Tensor
			if cfg.entropy {
				gde, cde = e.in(gpu.F32, 1, c)
				zero := []float32{0}
				gz, _ := gde.Flat(3, 4)
				cz, _ := cde.Flat(3, 4)
				e.set(gz, cz, zero) // a zero entropy gradient skips the entropy term
			}
			gdh, cdh := e.out(dt, c, h)
			gdw, cdw := e.in(gpu.F32, 1, v, h)
			e.check(name+" backward", e.g.LogProbsBackward(gdh, gdw, gdlp, gde, gh, gw, gtg, cfg.temp, cfg.tempered, glog),
				e.c.LogProbsBackward(cdh, cdw, cdlp, cde, ch, cw, ctg, cfg.temp, cfg.tempered, clog))
			e.compare(name+" dh", gdh, cdh, tolFor(true, dt))
			e.compare(name+" dw", gdw, cdw, tolFor(true, dt))
		}
	}
	// Mixed dtypes (f32 h, bf16 w) run the fallback products.
	c, h, v := 19, 48, 300
	gh, ch := e.in(gpu.F32, 1, c, h)
	gw, cw := e.in(gpu.BF16, 0.3, v, h)
	gtg, ctg := e.ids(e.randIDs(c, v))
	glog, clog := e.out(gpu.F32, c, v)
	glp, clp := e.out(gpu.F32, c)
	e.check("logprobs mixed", e.g.LogProbs(glp, gpu.Tensor{}, gh, gw, gtg, 1, false, glog, gpu.Tensor{}), e.c.LogProbs(clp, gpu.Tensor{}, ch, cw, ctg, 1, false, clog, gpu.Tensor{}))
	e.compare("logprobs f32 h, bf16 w logp", glp, clp, tolHeavy)
	gdlp, cdlp := e.in(gpu.F32, 1, c)
	gdh, cdh := e.out(gpu.F32, c, h)
	gdw, cdw := e.in(gpu.BF16, 1, v, h)
	e.check("logprobs mixed backward", e.g.LogProbsBackward(gdh, gdw, gdlp, gpu.Tensor{}, gh, gw, gtg, 1, false, glog),
		e.c.LogProbsBackward(cdh, cdw, cdlp, gpu.Tensor{}, ch, cw, ctg, 1, false, clog))
	e.compare("logprobs f32 h, bf16 w dh", gdh, cdh, tolHeavy)
	e.compare("logprobs f32 h, bf16 w dw", gdw, cdw, tol16)
}

func TestStreams(t *testing.T) {
	e := newEnv(t)
	s, err := e.g.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	on := e.g.On(s)
	gx, cx := e.in(gpu.F32, 1, 1<<20)
	gy, cy := e.out(gpu.F32, 1<<20)
	ga, ca := e.in(gpu.BF16, 1, 64, 256)
	gb, cb := e.in(gpu.BF16, 1, 128, 256)
	gc, cc := e.out(gpu.F32, 64, 128)
	// Streams are non-blocking: the uploads on the default stream must be
	// done before the side stream reads them.
	if err := e.g.DefaultStream().Sync(); err != nil {
		t.Fatal(err)
	}
	if err := on.Copy(gy, gx); err != nil {
		t.Fatal(err)
	}
	if err := on.Scale(gy, 3); err != nil {
		t.Fatal(err)
	}
	ev, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	if err := e.g.DefaultStream().Wait(ev); err != nil {
		t.Fatal(err)
	}
	if err := e.g.AddScaled(gy, gx, 1); err != nil { // default stream, after the event
		t.Fatal(err)
	}
	_ = e.c.Copy(cy, cx)
	_ = e.c.Scale(cy, 3)
	_ = e.c.AddScaled(cy, cx, 1)
	if err := ev.Sync(); err != nil {
		t.Fatal(err)
	}
	e.compare("streams and events", gy, cy, 0)
	// Products on a side stream run without the workspace.
	e.check("gemm on a stream", on.Gemm(gc, ga, gb, false, true, 1, 0), e.c.Gemm(cc, ca, cb, false, true, 1, 0))
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	e.compare("gemm on a side stream", gc, cc, tolHeavy)
}

// TestEventQuery: an event behind 50 ms of spinning on the stream is not
// done when recorded, and is once Sync returns.
func TestEventQuery(t *testing.T) {
	b := backend(t)
	if err := b.Delay(50 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	ev, err := b.DefaultStream().Record()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	q := ev.(*Event)
	if done, err := q.Query(); err != nil || done {
		t.Errorf("query behind the spin: done %v, %v; want not done", done, err)
	}
	if err := ev.Sync(); err != nil {
		t.Fatal(err)
	}
	if done, err := q.Query(); err != nil || !done {
		t.Errorf("query after sync: done %v, %v; want done", done, err)
	}
}

// TestTimedEvents checks RecordTimed and Since: products between two
// timed events take positive time, and an event without timing is
// refused.
func TestTimedEvents(t *testing.T) {
	e := newEnv(t)
	ga, _ := e.in(gpu.BF16, 1, 1024, 1024)
	gb, _ := e.in(gpu.BF16, 1, 1024, 1024)
	gc, _ := e.out(gpu.F32, 1024, 1024)
	s := e.g.DefaultStream().(*Stream)
	t0, err := s.RecordTimed()
	if err != nil {
		t.Fatal(err)
	}
	defer t0.Close()
	for range 20 {
		if err := e.g.Gemm(gc, ga, gb, false, true, 1, 0); err != nil {
			t.Fatal(err)
		}
	}
	t1, err := s.RecordTimed()
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Close()
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	d, err := t1.(*Event).Since(t0)
	if err != nil || d <= 0 {
		t.Fatalf("20 products took %v (%v)", d, err)
	}
	plain, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := plain.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.(*Event).Since(t0); err == nil {
		t.Error("an event without timing gave a time")
	}
	t.Logf("20 products of 1024³: %v", d)
}

func TestKernelCacheReused(t *testing.T) {
	backend(t) // skips without a driver
	t.Setenv("RLPIPE_CACHE_DIR", t.TempDir())
	before := compiles.Load()
	b1, err := New(0)
	if err != nil {
		t.Fatal(err)
	}
	first := compiles.Load() - before
	if err := b1.Close(); err != nil {
		t.Fatal(err)
	}
	mods, _ := modules()
	if first != int64(len(mods)) {
		t.Errorf("first backend compiled %d modules, want %d", first, len(mods))
	}
	before = compiles.Load()
	b2, err := New(0)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if n := compiles.Load() - before; n != 0 {
		t.Errorf("second backend compiled %d modules, want 0 (cache in %s)", n, cacheDir())
	}
	st, err := CompileAll(0, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if !s.Cached || s.Bytes == 0 {
			t.Errorf("module %s: cached %v, %d bytes", s.Module, s.Cached, s.Bytes)
		}
	}
}

func TestNoDriverSkipsCleanly(t *testing.T) {
	if _, err := New(0); err != nil && !errors.Is(err, ErrNoDriver) {
		// With a driver present any error is a real failure, reported by
		// the other tests; here only the error's shape matters.
		t.Logf("New: %v", err)
	} else if err != nil {
		t.Skip(err.Error()) // "cuda: no driver: ..."
	}
}

// hostColumns copies columns through host memory: the steps of QKVSplit and
// QKVPack for checking the fused kernels on the GPU.
type hostColumns struct{ b *Backend }

func (h hostColumns) CopyColumns(dst gpu.Tensor, dstCol int, src gpu.Tensor, srcCol, n int) error {
	t, dw, sw := dst.Shape[0], dst.Shape[1], src.Shape[1]
	d, s := make([]float32, dst.Numel()), make([]float32, src.Numel())
	if err := h.b.Download(d, dst); err != nil {
		return err
	}
	if err := h.b.Download(s, src); err != nil {
		return err
	}
	for r := range t {
		copy(d[r*dw+dstCol:r*dw+dstCol+n], s[r*sw+srcCol:r*sw+srcCol+n])
	}
	return h.b.Upload(dst, d)
}

// TestQKVFused checks QKVSplit and QKVPack against their steps (the same
// bits) and against the CPU, with and without biases, for head dims that
// take the 8-wide kernels (128, 64) and one that does not (40).
func TestQKVFused(t *testing.T) {
	e := newEnv(t)
	llama3 := &gpu.RoPEScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}
	same := e.sameBits
	hc := hostColumns{e.g}
	for _, dt := range floatTypes {
		for _, c := range []struct {
			n, hq, hkv, d int
			bias          bool
			sc            *gpu.RoPEScaling
		}{{67, 12, 2, 128, true, nil}, {67, 12, 2, 128, false, llama3}, {33, 14, 2, 64, true, nil}, {5, 3, 1, 40, true, llama3}} {
			e.off = 0
			name := fmt.Sprintf("%v %d tokens %d/%d heads of %d bias %v", dt, c.n, c.hq, c.hkv, c.d, c.bias)
			w := (c.hq + 2*c.hkv) * c.d
			gp, cp := e.ids(e.randIDs(c.n, 20000))
			gqkv, cqkv := e.in(dt, 1, c.n, w)
			var gb, cb gpu.Tensor
			if c.bias {
				gb, cb = e.in(dt, 1, w)
			}
			gq, cq := e.out(dt, c.n, c.hq, c.d)
			gk, ck := e.out(dt, c.n, c.hkv, c.d)
			gv, cv := e.out(dt, c.n, c.hkv, c.d)
			e.check("qkv split", e.g.QKVSplit(gq, gk, gv, gqkv, gb, gp, 1e6, c.sc), e.c.QKVSplit(cq, ck, cv, cqkv, cb, cp, 1e6, c.sc))
			for _, p := range []struct {
				what string
				g, c gpu.Tensor
			}{{"q", gq, cq}, {"k", gk, ck}, {"v", gv, cv}} {
				e.compare("qkv split "+p.what+" "+name, p.g, p.c, tolFor(false, dt))
			}
			sq, _ := e.alloc(dt, c.n, c.hq, c.d)
			sk, _ := e.alloc(dt, c.n, c.hkv, c.d)
			sv, _ := e.alloc(dt, c.n, c.hkv, c.d)
			if err := gpu.QKVSplitSteps(e.g, hc, sq, sk, sv, gqkv, gb, gp, 1e6, c.sc); err != nil {
				t.Fatal(err)
			}
			same("qkv split q "+name, gq, sq)
			same("qkv split k "+name, gk, sk)
			same("qkv split v "+name, gv, sv)

			// The backward: the fused pack leaves dq and dk, the steps
			// rotate them in place, so the steps get copies.
			gdq, cdq := e.in(dt, 1, c.n, c.hq, c.d)
			gdk, cdk := e.in(dt, 1, c.n, c.hkv, c.d)
			gdv, cdv := e.in(dt, 1, c.n, c.hkv, c.d)
			gd, cd := e.out(dt, c.n, w)
			dq2, _ := e.alloc(dt, c.n, c.hq, c.d)
			dk2, _ := e.alloc(dt, c.n, c.hkv, c.d)
			for _, cp2 := range [][2]gpu.Tensor{{dq2, gdq}, {dk2, gdk}} {
				if err := e.g.Copy(cp2[0], cp2[1]); err != nil {
					t.Fatal(err)
				}
			}
			e.check("qkv pack", e.g.QKVPack(gd, gdq, gdk, gdv, gp, 1e6, c.sc), e.c.QKVPack(cd, cdq, cdk, cdv, cp, 1e6, c.sc))
			e.compare("qkv pack "+name, gd, cd, tolFor(false, dt))
			d2, _ := e.alloc(dt, c.n, w)
			if err := gpu.QKVPackSteps(e.g, hc, d2, dq2, dk2, gdv, gp, 1e6, c.sc); err != nil {
				t.Fatal(err)
			}
			same("qkv pack "+name, gd, d2)
		}
	}
}

// TestDelay holds a stream for 20 ms and checks that the wait on it lasts
// at least that long, and that a negative delay is refused.
func TestDelay(t *testing.T) {
	b := backend(t)
	s, err := b.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	on := b.On(s).(*Backend)
	start := time.Now()
	if err := on.Delay(20 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 20*time.Millisecond {
		t.Errorf("the stream was held for %v, want at least 20ms", el)
	}
	if err := on.Delay(-time.Millisecond); err == nil {
		t.Error("a negative delay was accepted")
	}
}
