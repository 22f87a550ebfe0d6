//go:build cgo

package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// TestAttentionSpans checks ring attention's block ops against the CPU
// backend: span attention forward and backward over zigzag-like spans
// (a query block seeing a key block of half or twice its length, rows in
// no span, a span of one row) in f32 and bf16 with grouped-query heads,
// and the merge of two blocks. Outputs are poisoned before each run, so an
// unwritten element fails. Each case runs without spansWgmma and with it
// (on Hopper the wgmma kernels take the 16-bit ones at head dims 64 and
// 128), the forward on the wgmma kernel and on the warp-specialised one
// (attnFwdWS).
func TestAttentionSpans(t *testing.T) {
	defer func(v, ws bool) { spansWgmma, attnFwdWS = v, ws }(spansWgmma, attnFwdWS)
	for _, c := range []struct{ wg, ws bool }{{false, false}, {true, false}, {true, true}} {
		spansWgmma, attnFwdWS = c.wg, c.ws
		testAttentionSpans(t, fmt.Sprintf("wgmma %v ws %v ", c.wg, c.ws))
	}
}

func testAttentionSpans(t *testing.T, prefix string) {
	for _, cfg := range []struct {
		dt         gpu.DType
		rows       int
		spans      []gpu.Span
		hq, hkv, d int
		tol        float64
	}{
		{gpu.F32, 40, []gpu.Span{{Q: 0, QLen: 8, K: 0, KLen: 4}, {Q: 12, QLen: 4, K: 8, KLen: 8}, {Q: 20, QLen: 1, K: 30, KLen: 1}}, 4, 2, 64, tolF32},
		{gpu.F32, 300, []gpu.Span{{Q: 0, QLen: 100, K: 0, KLen: 50}, {Q: 150, QLen: 50, K: 100, KLen: 100}, {Q: 250, QLen: 40, K: 200, KLen: 20}}, 6, 2, 128, tolF32},
		{gpu.BF16, 300, []gpu.Span{{Q: 0, QLen: 100, K: 0, KLen: 50}, {Q: 150, QLen: 50, K: 100, KLen: 100}}, 12, 2, 128, tol16},
		// Zigzag-like blocks across the wgmma forward's 128-row CTAs and
		// 64-key tiles: spans straddling CTAs, rows in no span between
		// them and at the end, a key range that ends inside a tile.
		{gpu.BF16, 600, []gpu.Span{{Q: 0, QLen: 150, K: 0, KLen: 300}, {Q: 300, QLen: 150, K: 300, KLen: 150}, {Q: 500, QLen: 37, K: 470, KLen: 77}}, 14, 2, 64, tol16},
		{gpu.F16, 257, []gpu.Span{{Q: 1, QLen: 255, K: 2, KLen: 255}}, 4, 4, 128, tol16},
	} {
		name := prefix + fmt.Sprintf("spans %v rows %d %v hq%d hkv%d d%d", cfg.dt, cfg.rows, cfg.spans, cfg.hq, cfg.hkv, cfg.d)
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			n, dt, sc := cfg.rows, cfg.dt, float32(1/math.Sqrt(float64(cfg.d)))
			gq, cq := e.in(dt, 1, n, cfg.hq, cfg.d)
			gk, ck := e.in(dt, 1, n, cfg.hkv, cfg.d)
			gv, cv := e.in(dt, 1, n, cfg.hkv, cfg.d)
			gout, cout := e.out(dt, n, cfg.hq, cfg.d)
			glse, clse := e.out(gpu.F32, cfg.hq, n)
			e.check(name, e.g.AttentionSpans(gout, glse, gq, gk, gv, cfg.spans, sc), e.c.AttentionSpans(cout, clse, cq, ck, cv, cfg.spans, sc))
			e.compare(name+" out", gout, cout, cfg.tol)
			e.compare(name+" lse", glse, clse, 1e-4)
			// A second block, merged into the first: the merged rows are
			// what the backward reads as the whole ring's out and lse.
			gk2, ck2 := e.in(dt, 1, n, cfg.hkv, cfg.d)
			gv2, cv2 := e.in(dt, 1, n, cfg.hkv, cfg.d)
			gb, cb := e.out(dt, n, cfg.hq, cfg.d)
			gbl, cbl := e.out(gpu.F32, cfg.hq, n)
			e.check(name+" block 2", e.g.AttentionSpans(gb, gbl, gq, gk2, gv2, cfg.spans, sc), e.c.AttentionSpans(cb, cbl, cq, ck2, cv2, cfg.spans, sc))
			e.copyCPU(gout, cout)
			e.copyCPU(glse, clse)
			e.copyCPU(gb, cb)
			e.copyCPU(gbl, cbl)
			e.check(name+" merge", e.g.MergeAttention(gout, glse, gb, gbl), e.c.MergeAttention(cout, clse, cb, cbl))
			e.compare(name+" merged out", gout, cout, cfg.tol)
			e.compare(name+" merged lse", glse, clse, 1e-4)
			e.copyCPU(gout, cout)
			e.copyCPU(glse, clse)
			gdo, cdo := e.in(dt, 1, n, cfg.hq, cfg.d)
			gdq, cdq := e.out(dt, n, cfg.hq, cfg.d)
			gdk, cdk := e.out(dt, n, cfg.hkv, cfg.d)
			gdv, cdv := e.out(dt, n, cfg.hkv, cfg.d)
			e.check(name+" backward", e.g.AttentionSpansBackward(gdq, gdk, gdv, gdo, gout, glse, gq, gk, gv, cfg.spans, sc),
				e.c.AttentionSpansBackward(cdq, cdk, cdv, cdo, cout, clse, cq, ck, cv, cfg.spans, sc))
			e.compare(name+" dq", gdq, cdq, cfg.tol)
			e.compare(name+" dk", gdk, cdk, cfg.tol)
			e.compare(name+" dv", gdv, cdv, cfg.tol)
		})
	}
}
