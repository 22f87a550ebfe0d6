//go:build cgo

package cuda

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// TestLogProbsFused holds LogProbsFused to the CPU's LogProbs without
// entropy: row counts on and off the kernel's 128-row tiles, vocabularies
// on and off its 192-column tiles (down to one tile), hidden sizes of one
// and many 64-wide steps (more than its ring of buffers), more tiles than
// SMs, temperatures 1 and not; and to its own bits when run again. A target
// outside [0,V) gives NaN in its row and an error at the next Sync. It skips
// where the kernel does not run (not Hopper).
func TestLogProbsFused(t *testing.T) {
	e := newEnv(t)
	for _, dt := range []gpu.DType{gpu.BF16, gpu.F16} {
		for _, c := range []struct {
			rows, h, v int
			temp       float32
		}{{130, 64, 1000, 1}, {300, 128, 4099, 0.7}, {1, 64, 200, 1}, {257, 896, 2500, 1.3}, {1100, 512, 9000, 1}, {64, 320, 192, 1}} {
			e.off = 0
			name := fmt.Sprintf("%v rows %d h %d v %d T %v", dt, c.rows, c.h, c.v, c.temp)
			gh, ch := e.in(dt, 1, c.rows, c.h)
			gw, cw := e.in(dt, 0.3/math.Sqrt(float64(c.h)/64), c.v, c.h)
			gtg, ctg := e.ids(e.randIDs(c.rows, c.v))
			gws, cws := e.out(gpu.F32, c.rows, c.v)
			glp, clp := e.out(gpu.F32, c.rows)
			err := e.g.LogProbsFused(glp, gh, gw, gtg, c.temp, gws)
			if errors.Is(err, gpu.ErrNotFused) {
				t.Skipf("%s: %v", name, err)
			}
			e.check(name, err, e.c.LogProbs(clp, gpu.Tensor{}, ch, cw, ctg, c.temp, false, cws, gpu.Tensor{}))
			e.compare("logprobs fused "+name, glp, clp, tolHeavy)
			again, _ := e.out(gpu.F32, c.rows)
			if err := e.g.LogProbsFused(again, gh, gw, gtg, c.temp, gws); err != nil {
				t.Fatalf("%s, again: %v", name, err)
			}
			e.sameBits(name+", a second run against the first", again, glp)
		}
	}
	// A bad target: NaN in its row, the others as before, an error at Sync.
	e.off = 0
	rows, h, v := 40, 64, 500
	gh, _ := e.in(gpu.BF16, 1, rows, h)
	gw, _ := e.in(gpu.BF16, 0.3, v, h)
	gws, _ := e.out(gpu.F32, rows, v)
	e.checkBadTarget(rows, v, func(lp, tg gpu.Tensor) error { return e.g.LogProbsFused(lp, gh, gw, tg, 1, gws) })
}

// checkBadTarget runs op, which writes the log-probs of rows rows over a
// vocabulary of v into lp for the targets tg, on random targets and again
// with row 7's target v: row 7 must be NaN, the other rows as with the
// good targets, and the next Sync must give the targets error.
func (e *env) checkBadTarget(rows, v int, op func(lp, tg gpu.Tensor) error) {
	t := e.t
	t.Helper()
	ids := e.randIDs(rows, v)
	gtg, _ := e.ids(ids)
	good, _ := e.out(gpu.F32, rows)
	if err := op(good, gtg); err != nil {
		t.Fatal(err)
	}
	ids[7] = int32(v)
	bad, _ := e.ids(ids)
	lp, _ := e.out(gpu.F32, rows)
	if err := op(lp, bad); err != nil {
		t.Fatal(err)
	}
	if err := e.g.DefaultStream().Sync(); err == nil || !strings.Contains(err.Error(), "target") {
		t.Errorf("a target outside [0,V): Sync gave %v, want the targets error", err)
	}
	got, want := make([]float32, rows), make([]float32, rows)
	if err := e.g.Download(got, lp); err != nil {
		t.Fatal(err)
	}
	if err := e.g.Download(want, good); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if i == 7 {
			if !math.IsNaN(float64(got[i])) {
				t.Errorf("row 7 (bad target): %v, want NaN", got[i])
			}
		} else if got[i] != want[i] {
			t.Errorf("row %d: %v, want %v as with good targets", i, got[i], want[i])
		}
	}
}

// LogProbsFused refuses f32 operands, mixed dtypes and hidden sizes that
// are not multiples of 64 with gpu.ErrNotFused.
func TestLogProbsFusedRefuses(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		name   string
		hd, wd gpu.DType
		h      int
	}{{"f32", gpu.F32, gpu.F32, 64}, {"bf16 h, f16 w", gpu.BF16, gpu.F16, 64}, {"h 96", gpu.BF16, gpu.BF16, 96}} {
		e.off = 0
		x, _ := e.alloc(c.hd, 4, c.h)
		w, _ := e.alloc(c.wd, 300, c.h)
		tg, _ := e.ids([]int32{1, 2, 3, 4})
		ws, _ := e.alloc(gpu.F32, 4, 300)
		lp, _ := e.alloc(gpu.F32, 4)
		if err := e.g.LogProbsFused(lp, x, w, tg, 1, ws); !errors.Is(err, gpu.ErrNotFused) {
			t.Errorf("%s: got %v, want gpu.ErrNotFused", c.name, err)
		}
	}
}

// BenchmarkLogProbsHead times the log-prob head's chunk at one model's
// shapes with pseudo-random operands: LogProbs (the float32 logits
// through memory) and LogProbsFused; then the train step's chunk
// (model.Config.HeadStep) and its parts: LogProbs with entropies,
// LogitsBackward (the dlogits pass and the dh and dw products), and the
// logits, dh and dw products alone and k_lp_fwd alone. LogProbs takes
// lpHeadStore on Hopper (the product, the logits' store and the
// statistics in one kernel); with RLPIPE_CUDA_LP_STORE=0 it takes
// cuBLASLt's product and k_lp_fwd, the rows' statistics then being the
// difference from the product alone. RLPIPE_BENCH_LP="C,H,V" picks the
// shapes (default Qwen2.5-3B's with 2048-row chunks: "2048,2048,151936"):
//
//	go test -run '^$' -bench LogProbsHead -benchtime 20x ./gpu/cuda
func BenchmarkLogProbsHead(bb *testing.B) {
	b := backend(bb)
	C, H, V := 2048, 2048, 151936
	if d := os.Getenv("RLPIPE_BENCH_LP"); d != "" {
		if _, err := fmt.Sscanf(d, "%d,%d,%d", &C, &H, &V); err != nil {
			bb.Fatalf("RLPIPE_BENCH_LP=%q: want C,H,V: %v", d, err)
		}
	}
	mem, err := b.Alloc(int64(2*C*H+2*V*H)*2 + int64(C*V+5*C+C*gpu.LogProbsStatsCols)*4 + 16<<10)
	if err != nil {
		bb.Fatal(err)
	}
	defer b.Free(mem)
	var off int64
	ten := func(dt gpu.DType, shape ...int) gpu.Tensor { return benchTensor(bb, mem, &off, dt, shape...) }
	h, w := ten(gpu.BF16, C, H), ten(gpu.BF16, V, H)
	for _, x := range []gpu.Tensor{h, w} {
		if err := b.Upload(x, scrambled(x.Numel(), 0.05)); err != nil {
			bb.Fatal(err)
		}
	}
	tg, ws, lp := ten(gpu.I32, C), ten(gpu.F32, C, V), ten(gpu.F32, C)
	ids := make([]int32, C)
	for i := range ids {
		ids[i] = int32((i * 7919) % V)
	}
	if err := b.UploadI32(tg, ids); err != nil {
		bb.Fatal(err)
	}
	// The train step's chunk: entropies, the loss gradient of each row's
	// log-prob (dlogp), none of its entropy, the head's grads in bf16.
	ent, dlp, dent := ten(gpu.F32, C), ten(gpu.F32, C), ten(gpu.F32, C)
	st := ten(gpu.F32, C, gpu.LogProbsStatsCols)
	dh, dw := ten(gpu.BF16, C, H), ten(gpu.BF16, V, H)
	if err := b.Upload(dlp, scrambled(C, 1e-3)); err != nil {
		bb.Fatal(err)
	}
	for _, x := range []gpu.Tensor{dent, dw} {
		if err := b.Zero(x); err != nil {
			bb.Fatal(err)
		}
	}
	addr := func(x gpu.Tensor) uint64 {
		a, err := b.faddr("bench", "x", x)
		if err != nil {
			bb.Fatal(err)
		}
		return a
	}
	wa, ha, wsa, dha, dwa := addr(w), addr(h), addr(ws), addr(dh), addr(dw)
	lpa, err := b.lpCheck("bench", ent, h, w, tg, 1, ws)
	if err != nil {
		bb.Fatal(err)
	}
	// The bf16 dlogits LogitsBackward leaves, packed at the start of each
	// float32 row of the workspace.
	dl := mat{wsa, gpu.BF16, C, V, 2 * int64(V)}
	flops := 2 * float64(C) * float64(H) * float64(V)
	shape := fmt.Sprintf("%dx%dx%d", C, V, H)
	for _, c := range []struct {
		name     string
		products float64
		f        func() error
	}{
		{"logits " + shape, 1, func() error { return b.LogProbs(lp, gpu.Tensor{}, h, w, tg, 1, false, ws, gpu.Tensor{}) }},
		{"fused " + shape, 1, func() error { return b.LogProbsFused(lp, h, w, tg, 1, ws) }},
		{"step: logits product alone " + shape, 1, func() error {
			return b.matmul(mat{wsa, gpu.F32, C, V, int64(V)}, mat{ha, gpu.BF16, C, H, int64(H)}, mat{wa, gpu.BF16, V, H, int64(H)}, false, true, 1, 0)
		}},
		{"step: logits + entropy " + shape, 1, func() error { return b.LogProbs(lp, ent, h, w, tg, 1, false, ws, st) }},
		// The row statistics of the logits the row above left (k_lp_fwd
		// does not change them).
		{"step: k_lp_fwd with entropies alone " + shape, 0, func() error {
			return b.lpRows(lpa, 1, false, addr(lp), addr(ent), addr(st))
		}},
		// With the statistics LogProbs left (the train step's), then
		// without (each row's read twice).
		{"step: logits backward " + shape, 2, func() error { return b.LogitsBackward(dh, dw, dlp, dent, h, w, tg, 1, false, ws, st) }},
		{"step: logits backward without statistics " + shape, 2, func() error {
			return b.LogitsBackward(dh, dw, dlp, dent, h, w, tg, 1, false, ws, gpu.Tensor{})
		}},
		{"step: dh product alone " + shape, 1, func() error {
			return b.matmul(mat{dha, gpu.BF16, C, H, int64(H)}, dl, mat{wa, gpu.BF16, V, H, int64(H)}, false, false, 1, 0)
		}},
		{"step: dw product alone " + shape, 1, func() error {
			return b.matmul(mat{dwa, gpu.BF16, V, H, int64(H)}, dl, mat{ha, gpu.BF16, C, H, int64(H)}, true, false, 1, 1)
		}},
	} {
		// A row without products reads the float32 logits once.
		bytes := 0.0
		if c.products == 0 {
			bytes = 4 * float64(C) * float64(V)
		}
		timeOp(bb, b, c.name, c.products*flops, bytes, c.f)
	}
}
