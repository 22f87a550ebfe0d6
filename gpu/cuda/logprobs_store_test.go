//go:build cgo

package cuda

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// withStore sets lpStoreOff to off for the rest of the test.
func withStore(t *testing.T, off bool) {
	was := lpStoreOff
	lpStoreOff = off
	t.Cleanup(func() { lpStoreOff = was })
}

// TestLogProbsHeadStore holds LogProbs through lpHeadStore (the product,
// the logits' store and the row statistics in one kernel) to the CPU's
// LogProbs: the logits it leaves, the log-probs and entropies; rows on and
// off the kernel's 128-row tiles, vocabularies on and off its 256-column
// tiles (one tile up to many), hidden sizes of one and many 64-wide steps,
// temperatures 1 and not, entropies tempered or at a temperature of 1. Its
// statistics must carry the tag k_lp_bwd8 takes (their log-sum-exp within
// 1e-6 of the CPU's logits' in float64), and LogitsBackward on them must
// match the CPU's LogitsBackward and read them (row 0's log-sum-exp
// changed, only row 0's dh changes). A second run gives the same bits.
// Where the kernel does not run (not Hopper) it skips.
func TestLogProbsHeadStore(t *testing.T) {
	e := newEnv(t)
	withStore(t, false)
	if !e.g.wgmma() {
		t.Skip("lpHeadStore needs Hopper's wgmma")
	}
	for _, dt := range []gpu.DType{gpu.BF16, gpu.F16} {
		for _, c := range []struct {
			rows, h, v int
			temp       float32
			tempered   bool
			entropy    bool
		}{{130, 64, 1000, 1, false, true}, {300, 128, 4098, 0.7, true, true}, {1, 64, 200, 1, false, false},
			{257, 896, 2500, 1.3, false, false}, {1100, 512, 9000, 1, false, true}, {64, 320, 256, 0.7, true, true}} {
			e.off = 0
			name := fmt.Sprintf("%v rows %d h %d v %d T %v tempered %v entropy %v", dt, c.rows, c.h, c.v, c.temp, c.tempered, c.entropy)
			gh, ch := e.in(dt, 1, c.rows, c.h)
			gw, cw := e.in(dt, 0.3/math.Sqrt(float64(c.h)/64), c.v, c.h)
			gtg, ctg := e.ids(e.randIDs(c.rows, c.v))
			glog, clog := e.out(gpu.F32, c.rows, c.v)
			glp, clp := e.out(gpu.F32, c.rows)
			var gent, cent gpu.Tensor
			if c.entropy {
				gent, cent = e.out(gpu.F32, c.rows)
			}
			gst, _ := e.out(gpu.F32, c.rows, gpu.LogProbsStatsCols)
			// The kernel must take these operands: LogProbs would
			// otherwise pass on cuBLASLt's path alone.
			a, err := e.g.lpCheck("test", gent, gh, gw, gtg, c.temp, glog)
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := e.g.lpStoreTakes(a, dt, dt, c.temp, c.tempered); !ok || err != nil {
				t.Fatalf("%s: lpHeadStore does not take the operands (%v)", name, err)
			}
			e.check(name, e.g.LogProbs(glp, gent, gh, gw, gtg, c.temp, c.tempered, glog, gst),
				e.c.LogProbs(clp, cent, ch, cw, ctg, c.temp, c.tempered, clog, gpu.Tensor{}))
			e.compare(name+" logits", glog, clog, tolHeavy)
			e.compare(name+" logp", glp, clp, tolHeavy)
			if c.entropy {
				e.compare(name+" entropy", gent, cent, tolHeavy)
			}
			e.checkStats(name, gst, clog, c.rows, c.v, c.temp, c.entropy)
			// The same bits again.
			lp2, _ := e.out(gpu.F32, c.rows)
			log2, _ := e.out(gpu.F32, c.rows, c.v)
			st2, _ := e.out(gpu.F32, c.rows, gpu.LogProbsStatsCols)
			var ent2 gpu.Tensor
			if c.entropy {
				ent2, _ = e.out(gpu.F32, c.rows)
			}
			if err := e.g.LogProbs(lp2, ent2, gh, gw, gtg, c.temp, c.tempered, log2, st2); err != nil {
				t.Fatal(err)
			}
			e.sameBits(name+": logp, a second run", lp2, glp)
			e.sameBits(name+": logits, a second run", log2, glog)
			e.sameBits(name+": statistics, a second run", st2, gst)
			if c.entropy {
				e.sameBits(name+": entropy, a second run", ent2, gent)
			}
			// LogitsBackward on the saved statistics against the CPU's.
			gdlp, cdlp := e.in(gpu.F32, 1, c.rows)
			var gde, cde gpu.Tensor
			if c.entropy {
				gde, cde = e.in(gpu.F32, 1, c.rows)
			}
			gdh, cdh := e.out(dt, c.rows, c.h)
			gdw, cdw := e.in(gpu.F32, 1, c.v, c.h)
			e.check(name+" backward", e.g.LogitsBackward(gdh, gdw, gdlp, gde, gh, gw, gtg, c.temp, c.tempered, glog, gst),
				e.c.LogitsBackward(cdh, cdw, cdlp, cde, ch, cw, ctg, c.temp, c.tempered, clog, gpu.Tensor{}))
			e.compare(name+" dh", gdh, cdh, tolFor(true, dt))
			e.compare(name+" dw", gdw, cdw, tolFor(true, dt))
			if c.rows > 1 {
				e.statsRead(name, dt, gst, log2, gdlp, gde, gh, gw, gtg, c.rows, c.h, c.v, c.temp, c.tempered)
			}
		}
	}
}

// checkStats checks the statistics lpHeadStore left in st: each row's tag
// is k_lp_fwd's for temp and the mode (LP_ENT_Z with an entropy, else
// LP_LSE), its log-sum-exp within 1e-6 (relative) of the float64
// log-sum-exp of the CPU's logits clog over temp, and with an entropy its
// lseU equal to its lseZ.
func (e *env) checkStats(name string, st, clog gpu.Tensor, rows, v int, temp float32, entropy bool) {
	e.t.Helper()
	raw := make([]byte, st.Bytes())
	if err := e.g.DownloadBytes(raw, st); err != nil {
		e.t.Fatal(err)
	}
	l := make([]float32, clog.Numel())
	if err := e.c.Download(l, clog); err != nil {
		e.t.Fatal(err)
	}
	mode := 0.0
	if entropy {
		mode = 1
	}
	tag := float64(math.Float32bits(temp))*4 + mode
	for r := range rows {
		f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(raw[32*r+8*i:])) }
		if f(3) != tag {
			e.t.Errorf("%s: row %d's statistics tag %v, want %v", name, r, f(3), tag)
			return
		}
		mx := math.Inf(-1)
		for _, x := range l[r*v : (r+1)*v] {
			mx = math.Max(mx, float64(x/temp))
		}
		var s float64
		for _, x := range l[r*v : (r+1)*v] {
			s += math.Exp(float64(x/temp) - mx)
		}
		want := mx + math.Log(s)
		if d := math.Abs(f(0) - want); !(d <= 1e-6*math.Max(1, math.Abs(want))) {
			e.t.Errorf("%s: row %d's log-sum-exp %v, want %v", name, r, f(0), want)
			return
		}
		if entropy && f(1) != f(0) {
			e.t.Errorf("%s: row %d's lseU %v, want its lseZ %v", name, r, f(1), f(0))
			return
		}
	}
}

// statsRead checks that LogitsBackward reads the statistics in st rather
// than computing them again: with row 0's log-sum-exp one higher, row 0's
// dh changes and no other row's does. logits are LogProbs' logits, which
// LogitsBackward overwrites; they are restored from a copy each run.
func (e *env) statsRead(name string, dt gpu.DType, st, logits, dlp, de, h, w, tg gpu.Tensor, rows, hd, v int, temp float32, tempered bool) {
	e.t.Helper()
	keep, _ := e.alloc(gpu.F32, rows, v)
	if err := e.g.Copy(keep, logits); err != nil {
		e.t.Fatal(err)
	}
	run := func() []byte {
		if err := e.g.Copy(logits, keep); err != nil {
			e.t.Fatal(err)
		}
		dh, _ := e.out(dt, rows, hd)
		if err := e.g.LogitsBackward(dh, gpu.Tensor{}, dlp, de, h, w, tg, temp, tempered, logits, st); err != nil {
			e.t.Fatal(err)
		}
		b := make([]byte, dh.Bytes())
		if err := e.g.DownloadBytes(b, dh); err != nil {
			e.t.Fatal(err)
		}
		return b
	}
	before := run()
	raw := make([]byte, st.Bytes())
	if err := e.g.DownloadBytes(raw, st); err != nil {
		e.t.Fatal(err)
	}
	lse := math.Float64frombits(binary.LittleEndian.Uint64(raw))
	binary.LittleEndian.PutUint64(raw, math.Float64bits(lse+1))
	if err := e.g.UploadBytes(st, raw); err != nil {
		e.t.Fatal(err)
	}
	after := run()
	row := hd * dt.Size()
	if bytes.Equal(before[:row], after[:row]) {
		e.t.Errorf("%s: row 0's dh did not change with its saved log-sum-exp: the statistics were not read", name)
	}
	if !bytes.Equal(before[row:], after[row:]) {
		e.t.Errorf("%s: rows past 0 changed with row 0's saved statistics", name)
	}
}

// lpStoreTakes refuses f32 or mixed operands, unaligned ones, hidden sizes
// off 64, an odd vocabulary, an untempered entropy at a temperature other
// than 1, a stream without the cuBLASLt workspace and a vocabulary so large
// that not even one block of 128 rows has its partials fit it (16384 rows
// of Qwen's vocabulary go in blocks); and everything under
// RLPIPE_CUDA_LP_STORE=0. The operands are shapes and
// addresses only: it reads no memory.
func TestLogProbsHeadStoreRefuses(t *testing.T) {
	e := newEnv(t)
	withStore(t, false)
	if !e.g.wgmma() {
		t.Skip("lpHeadStore needs Hopper's wgmma")
	}
	side, err := e.g.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer side.Close()
	ok := lpArgs{c: 4, hd: 64, v: 300, h: 1 << 20, w: 2 << 20, tg: 3 << 20, logits: 4 << 20}
	with := func(f func(*lpArgs)) lpArgs { a := ok; f(&a); return a }
	for _, c := range []struct {
		name             string
		a                lpArgs
		hd, wd           gpu.DType
		temp             float32
		tempered, onSide bool
		off, want        bool
	}{
		{"bf16 (taken)", ok, gpu.BF16, gpu.BF16, 1, false, false, false, true},
		{"f16 (taken)", ok, gpu.F16, gpu.F16, 1, false, false, false, true},
		{"f32", ok, gpu.F32, gpu.F32, 1, false, false, false, false},
		{"bf16 h, f16 w", ok, gpu.BF16, gpu.F16, 1, false, false, false, false},
		{"h at 8 bytes", with(func(a *lpArgs) { a.h += 8 }), gpu.BF16, gpu.BF16, 1, false, false, false, false},
		{"logits at 4 bytes", with(func(a *lpArgs) { a.logits += 4 }), gpu.BF16, gpu.BF16, 1, false, false, false, false},
		{"H 96", with(func(a *lpArgs) { a.hd = 96 }), gpu.BF16, gpu.BF16, 1, false, false, false, false},
		{"V 301", with(func(a *lpArgs) { a.v = 301 }), gpu.BF16, gpu.BF16, 1, false, false, false, false},
		{"untempered entropy at 0.7", with(func(a *lpArgs) { a.hasEntropy = true }), gpu.BF16, gpu.BF16, 0.7, false, false, false, false},
		{"tempered entropy at 0.7 (taken)", with(func(a *lpArgs) { a.hasEntropy = true }), gpu.BF16, gpu.BF16, 0.7, true, false, false, true},
		{"untempered entropy at 1 (taken)", with(func(a *lpArgs) { a.hasEntropy = true }), gpu.BF16, gpu.BF16, 1, false, false, false, true},
		{"4096 rows of 151936 with entropies (taken)", with(func(a *lpArgs) { a.c, a.v, a.hasEntropy = 4096, 151936, true }), gpu.BF16, gpu.BF16, 1, false, false, false, true},
		{"16384 rows of 151936 with entropies (taken, in blocks)", with(func(a *lpArgs) { a.c, a.v, a.hasEntropy = 16384, 151936, true }), gpu.BF16, gpu.BF16, 1, false, false, false, true},
		{"a vocabulary of 10^7 with entropies", with(func(a *lpArgs) { a.c, a.v, a.hasEntropy = 128, 10_000_000, true }), gpu.BF16, gpu.BF16, 1, false, false, false, false},
		{"a side stream", ok, gpu.BF16, gpu.BF16, 1, false, true, false, false},
		{"RLPIPE_CUDA_LP_STORE=0", ok, gpu.BF16, gpu.BF16, 1, false, false, true, false},
	} {
		lpStoreOff = c.off
		b := e.g
		if c.onSide {
			b = e.g.On(side).(*Backend)
		}
		got, err := b.lpStoreTakes(c.a, c.hd, c.wd, c.temp, c.tempered)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got != c.want {
			t.Errorf("%s: lpHeadStore takes it: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestLogProbsHeadStoreBlock pins lpStoreBlock's blocks: one where the
// partials of all rows fit the workspace, else the fewest that fit, of equal
// rows in whole 128-row tiles, and none where not even 128 rows fit.
func TestLogProbsHeadStoreBlock(t *testing.T) {
	for _, c := range []struct {
		c, v    int
		entropy bool
		cap     int // lpStoreRows
		want    int
	}{
		{2048, 151936, true, 0, 2048},
		{4096, 151936, true, 0, 4096},
		{4608, 151936, true, 0, 4608}, // 7132 bytes a row: 4608 rows (36 tiles) fit
		{4609, 151936, true, 0, 2432},
		{16384, 151936, true, 0, 4096},
		{16384, 151936, false, 0, 5504}, // 4756 bytes a row: 7040 fit, 3 blocks
		{128, 10_000_000, true, 0, 0},
		{1, 300, false, 0, 1},
		{300, 4098, true, 128, 128},
		{1100, 9000, true, 300, 256},
		{100, 1000, true, 1, 100},
	} {
		was := lpStoreRows
		lpStoreRows = c.cap
		got := lpStoreBlock(c.c, c.v, c.entropy)
		lpStoreRows = was
		if got != c.want {
			t.Errorf("lpStoreBlock(%d, %d, %v) with lpStoreRows %d = %d, want %d", c.c, c.v, c.entropy, c.cap, got, c.want)
		}
	}
}

// TestLogProbsHeadStoreBlocks runs LogProbs through lpHeadStore in blocks
// of 128 rows (lpStoreRows) and in one: the logits, log-probs, entropies
// and statistics have the same bits, the rows' tiles being the same either
// way; rows on and off the tiles, with and without entropies.
func TestLogProbsHeadStoreBlocks(t *testing.T) {
	e := newEnv(t)
	withStore(t, false)
	if !e.g.wgmma() {
		t.Skip("lpHeadStore needs Hopper's wgmma")
	}
	was := lpStoreRows
	t.Cleanup(func() { lpStoreRows = was })
	for _, c := range []struct {
		rows, h, v int
		temp       float32
		tempered   bool
		entropy    bool
	}{{300, 128, 4098, 0.7, true, true}, {257, 896, 2500, 1.3, false, false}, {1100, 512, 9000, 1, false, true}} {
		e.off = 0
		name := fmt.Sprintf("rows %d h %d v %d T %v entropy %v", c.rows, c.h, c.v, c.temp, c.entropy)
		gh, _ := e.in(gpu.BF16, 1, c.rows, c.h)
		gw, _ := e.in(gpu.BF16, 0.3/math.Sqrt(float64(c.h)/64), c.v, c.h)
		gtg, _ := e.ids(e.randIDs(c.rows, c.v))
		var outs [2][4]gpu.Tensor // logits, logp, entropy, stats
		for i, cap := range []int{128, 0} {
			lpStoreRows = cap
			if rb := lpStoreBlock(c.rows, c.v, c.entropy); (cap > 0) != (rb < c.rows) {
				t.Fatalf("%s: lpStoreRows %d gives blocks of %d rows", name, cap, rb)
			}
			o := &outs[i]
			o[0], _ = e.out(gpu.F32, c.rows, c.v)
			o[1], _ = e.out(gpu.F32, c.rows)
			if c.entropy {
				o[2], _ = e.out(gpu.F32, c.rows)
			}
			o[3], _ = e.out(gpu.F32, c.rows, gpu.LogProbsStatsCols)
			a, err := e.g.lpCheck("test", o[2], gh, gw, gtg, c.temp, o[0])
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := e.g.lpStoreTakes(a, gpu.BF16, gpu.BF16, c.temp, c.tempered); !ok || err != nil {
				t.Fatalf("%s: lpHeadStore does not take the operands (%v)", name, err)
			}
			if err := e.g.LogProbs(o[1], o[2], gh, gw, gtg, c.temp, c.tempered, o[0], o[3]); err != nil {
				t.Fatal(err)
			}
		}
		for k, what := range []string{"logits", "logp", "entropy", "statistics"} {
			if outs[0][k].Mem != nil {
				e.sameBits(name+": "+what+" in blocks of 128 rows and in one", outs[0][k], outs[1][k])
			}
		}
	}
}

// A target outside [0,V) through lpHeadStore: NaN in its row's log-prob,
// the other rows as with good targets, and the targets error at the next
// Sync, as k_lp_fwd gives.
func TestLogProbsHeadStoreBadTarget(t *testing.T) {
	e := newEnv(t)
	withStore(t, false)
	if !e.g.wgmma() {
		t.Skip("lpHeadStore needs Hopper's wgmma")
	}
	rows, h, v := 40, 64, 500
	gh, _ := e.in(gpu.BF16, 1, rows, h)
	gw, _ := e.in(gpu.BF16, 0.3, v, h)
	logits, _ := e.out(gpu.F32, rows, v)
	ent, _ := e.out(gpu.F32, rows)
	e.checkBadTarget(rows, v, func(lp, tg gpu.Tensor) error {
		a, err := e.g.lpCheck("test", ent, gh, gw, tg, 1, logits)
		if err != nil {
			return err
		}
		if ok, err := e.g.lpStoreTakes(a, gpu.BF16, gpu.BF16, 1, false); !ok || err != nil {
			return fmt.Errorf("lpHeadStore does not take the operands (%v)", err)
		}
		return e.g.LogProbs(lp, ent, gh, gw, tg, 1, false, logits, gpu.Tensor{})
	})
}
