//go:build cgo

package cuda

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// TestAttentionTensorCore checks the tensor-core attention kernels (bf16
// and f16, head dims 64 and 128) against the CPU backend on long packed
// sequences whose boundaries fall inside 64-row tiles, with grouped-query
// and plain multi-head layouts: on Hopper both the wgmma kernels (the
// default there) and the mma.sync ones, elsewhere the mma.sync ones.
// Outputs are poisoned before each run, so an unwritten element fails. It
// also checks that the backward is deterministic (two runs agree bit for
// bit).
//
// On Hopper the kernels run as wgmma ones fed by cp.async ("wgmma") and
// with the TMA loads: the warp-specialised forward with and without its
// consumers' turns, and the dk/dv pass (attnFwdWS, attnFwdPingpong,
// attnBwdTMA).
func TestAttentionTensorCore(t *testing.T) {
	type path struct {
		name                 string
		noWgmma, ws, pp, tma bool
	}
	paths := []path{{name: "mma.sync", noWgmma: true}}
	if e := newEnv(t); e.g.d.info.Hopper() {
		paths = append(paths, path{name: "wgmma"}, path{name: "wgmma-tma", ws: true, tma: true},
			path{name: "wgmma-tma-pingpong", ws: true, pp: true, tma: true})
	}
	defer func(ws, pp, tma bool) {
		attnNoWgmma, attnFwdWS, attnFwdPingpong, attnBwdTMA = false, ws, pp, tma
	}(attnFwdWS, attnFwdPingpong, attnBwdTMA)
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			attnNoWgmma, attnFwdWS, attnFwdPingpong, attnBwdTMA = p.noWgmma, p.ws, p.pp, p.tma
			testAttentionTensorCore(t)
		})
	}
}

func testAttentionTensorCore(t *testing.T) {
	const tolLSE = 1e-3
	for _, cfg := range []struct {
		dt         gpu.DType
		lens       []int
		hq, hkv, d int
	}{
		{gpu.BF16, []int{5, 700, 1300}, 12, 2, 128},
		{gpu.BF16, []int{5, 700, 1300}, 12, 2, 64},
		{gpu.BF16, []int{5, 700, 1300}, 4, 4, 128},
		{gpu.BF16, []int{5, 700, 1300}, 4, 4, 64},
		{gpu.BF16, []int{63, 1, 65, 130, 0, 200, 3}, 6, 3, 64},
		{gpu.F16, []int{5, 700, 1300}, 12, 2, 128},
		{gpu.F16, []int{70, 0, 129, 5}, 4, 4, 64},
		{gpu.BF16, []int{2048, 1000, 24}, 12, 2, 128},
		{gpu.BF16, []int{1, 127, 128, 129, 257}, 14, 2, 64},
	} {
		name := fmt.Sprintf("tc attention %v seqs%v hq%d hkv%d d%d", cfg.dt, cfg.lens, cfg.hq, cfg.hkv, cfg.d)
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			dt := cfg.dt
			r := e.compareAttention(name, dt, cfg.lens, cfg.hq, cfg.hkv, cfg.d, tol16, tolLSE)
			n := r.q.Shape[0]
			// A second backward into fresh poisoned outputs must match bit for bit.
			hdq, _ := e.out(dt, n, cfg.hq, cfg.d)
			hdk, _ := e.out(dt, n, cfg.hkv, cfg.d)
			hdv, _ := e.out(dt, n, cfg.hkv, cfg.d)
			if err := e.g.AttentionBackward(hdq, hdk, hdv, r.dout, r.out, r.lse, r.q, r.k, r.v, r.cu, r.scale); err != nil {
				t.Fatal(err)
			}
			for _, p := range [][2]gpu.Tensor{{r.dq, hdq}, {r.dk, hdk}, {r.dv, hdv}} {
				a := make([]byte, p[0].Bytes())
				b := make([]byte, p[1].Bytes())
				if err := e.g.DownloadBytes(a, p[0]); err != nil {
					t.Fatal(err)
				}
				if err := e.g.DownloadBytes(b, p[1]); err != nil {
					t.Fatal(err)
				}
				if string(a) != string(b) {
					t.Errorf("%s: backward is not deterministic", name)
				}
			}
		})
	}
}

// TestAttentionPathSelection checks which kernels a call would use.
func TestAttentionPathSelection(t *testing.T) {
	bf := gpu.Tensor{DType: gpu.BF16}
	f16 := gpu.Tensor{DType: gpu.F16}
	f32 := gpu.Tensor{DType: gpu.F32}
	for _, c := range []struct {
		d    int
		ts   []gpu.Tensor
		as   []uint64
		want string
	}{
		{128, []gpu.Tensor{bf, bf}, []uint64{256, 512}, "bf16_128"},
		{64, []gpu.Tensor{f16, f16}, []uint64{256, 512}, "f16_64"},
		{96, []gpu.Tensor{bf, bf}, []uint64{256, 512}, ""},
		{128, []gpu.Tensor{f32, f32}, []uint64{256, 512}, ""},
		{128, []gpu.Tensor{bf, f16}, []uint64{256, 512}, ""},
		{128, []gpu.Tensor{bf, bf}, []uint64{256, 520}, ""},
	} {
		if got := faSuffix(c.d, c.ts, c.as); got != c.want {
			t.Errorf("faSuffix(%d, %v, %v) = %q, want %q", c.d, c.ts, c.as, got, c.want)
		}
	}
}

// TestTensorCoreLaunch checks the launch shapes of the tensor-core
// attention kernels per device (no GPU needed): the wgmma kernels on
// compute capability 9.0, one CTA per block and head after k_attn_order,
// with the CTA sizes and shared memory the kernels assume, within the
// H100's 227 KB a block may use; the mma.sync ones elsewhere and under
// attnNoWgmma, on a grid of blocks × heads.
func TestTensorCoreLaunch(t *testing.T) {
	hopper := &Backend{d: &device{info: DeviceInfo{CCMajor: 9, CCMinor: 0}}}
	ampere := &Backend{d: &device{info: DeviceInfo{CCMajor: 8, CCMinor: 0}}}
	const tokens, heads, faSmem, ord = 1000, 12, 777, 4096
	for _, c := range []struct {
		b         *Backend
		noWgmma   bool
		op        string
		d         int
		name      string
		blocks    uint32 // of the batch's rows
		bx        uint32
		smem, max int
	}{
		{hopper, false, "fwd", 128, "k_wg_fwd_bf16_128", 8, 256, 0, 232448},
		{hopper, false, "fwd", 64, "k_wg_fwd_bf16_64", 8, 256, 0, 232448},
		{hopper, false, "dq", 128, "k_wg_dq_bf16_128", 16, 128, 0, 232448 / 3},
		{hopper, false, "dkv", 128, "k_wg_dkv_bf16_128", 8, 384, 0, 232448},
		{hopper, false, "dkv", 64, "k_wg_dkv_bf16_64", 8, 384, 0, 232448},
		{hopper, true, "fwd", 128, "k_fa_fwd_bf16_128", 16, 128, faSmem, 0},
		{ampere, false, "dkv", 128, "k_fa_dkv_bf16_128", 16, 128, faSmem, 0},
	} {
		attnNoWgmma = c.noWgmma
		a := attnArgs{t: tokens, d: c.d, ns1: 3}
		ls := c.b.tcLaunch(c.op, fmt.Sprintf("bf16_%d", c.d), a, heads, faSmem, new(kargs), ord)
		attnNoWgmma = false
		wg := strings.HasPrefix(c.name, "k_wg_")
		if want := map[bool]int{true: 2, false: 1}[wg]; len(ls) != want {
			t.Fatalf("%s: %d launches, want %d", c.name, len(ls), want)
		}
		l := ls[len(ls)-1]
		gx, gy := c.blocks, uint32(heads)
		if wg {
			gx, gy = c.blocks*heads, 1
			o := ls[0]
			if o.name != "k_attn_order" || o.gx != 1 || o.bx != 1024 || o.smem != 8*16 && o.smem != 8*8 {
				t.Errorf("%s: order launch %s grid %d block %d smem %d", c.name, o.name, o.gx, o.bx, o.smem)
			}
		}
		if l.name != c.name || l.gx != gx || l.gy != gy || l.bx != c.bx {
			t.Errorf("%s d%d (cc %d.%d, noWgmma %v): got %s grid %d×%d block %d, want %s grid %d×%d block %d",
				c.op, c.d, c.b.d.info.CCMajor, c.b.d.info.CCMinor, c.noWgmma, l.name, l.gx, l.gy, l.bx, c.name, gx, gy, c.bx)
		}
		if c.smem != 0 && l.smem != c.smem {
			t.Errorf("%s: shared memory %d, want %d", l.name, l.smem, c.smem)
		}
		if c.max != 0 && (l.smem > c.max || l.smem < 1024) {
			t.Errorf("%s: shared memory %d outside (1024, %d]", l.name, l.smem, c.max)
		}
	}
	// The warp-specialised forward (wsLaunch, which needs a GPU for its
	// tensor maps): its tiles within the 227 KB, its tiles' rows within
	// a TMA box (256 at most).
	for _, d := range []int{64, 128} {
		if m := wsSmem(d); m > 232448 || m < wgBM*d*2+2*wsStages*wsBN*d*2 {
			t.Errorf("wsSmem(%d) = %d", d, m)
		}
	}
	if wsBN > 256 || wgBM > 256 {
		t.Errorf("tile rows %d and %d exceed a TMA box", wsBN, wgBM)
	}
	if got, want := (DeviceInfo{CCMajor: 9}).Arch(), "sm_90a"; got != want {
		t.Errorf("Arch of 9.0 = %q, want %q", got, want)
	}
	if got, want := (DeviceInfo{CCMajor: 8, CCMinor: 6}).Arch(), "sm_86"; got != want {
		t.Errorf("Arch of 8.6 = %q, want %q", got, want)
	}
}

// TestAttentionOrder checks k_attn_order against the work it is meant to
// sort by, computed here: for query blocks of 64 and 128 rows and key
// blocks of 128, on batches of equal, mixed and single sequences, the order
// is a permutation of the blocks with non-increasing work and, among equal
// work, increasing index; past orderMax blocks it is the reverse index
// order for query blocks and the index order for key blocks.
func TestAttentionOrder(t *testing.T) {
	e := newEnv(t)
	work := func(cu []int32, t, rows, i int, keys bool) int {
		r0, r1 := i*rows, min(i*rows+rows, t)-1
		s := 0
		for s+1 < len(cu)-1 && int(cu[s+1]) <= r0 {
			s++
		}
		if !keys {
			return r1 - int(cu[s]) + 1
		}
		e := 0
		for e < len(cu)-1 && int(cu[e]) <= r1 {
			e++
		}
		return int(cu[e]) - r0
	}
	for _, c := range []struct {
		name string
		lens []int
	}{
		{"8 x 2048", []int{2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048}},
		{"mixed", []int{1, 700, 64, 3000, 129, 2, 5000, 311}},
		{"one", []int{9000}},
		{"past the sort", []int{orderMax*64 + 100}},
		{"past the sort for 128 rows", []int{orderMax*128 + 100}},
	} {
		cu := packed(c.lens...)
		tok := int(cu[len(cu)-1])
		gcu, _ := e.ids(cu)
		ord, _ := e.alloc(gpu.I32, tok/64+1)
		oa, err := e.g.taddr("order", "order", ord, gpu.I32)
		if err != nil {
			t.Fatal(err)
		}
		ca, err := e.g.taddr("order", "cu", gcu, gpu.I32)
		if err != nil {
			t.Fatal(err)
		}
		a := attnArgs{t: tok, ns1: len(cu), cu: ca}
		for _, k := range []struct {
			rows int
			keys bool
		}{{64, false}, {128, false}, {128, true}} {
			nb := (tok + k.rows - 1) / k.rows
			if err := e.g.issue(orderLaunch(a, k.rows, nb, k.keys, oa)); err != nil {
				t.Fatal(err)
			}
			got := make([]int32, ord.Numel())
			if err := e.g.DownloadI32(got, ord); err != nil {
				t.Fatal(err)
			}
			got = got[:nb]
			seen := make([]bool, nb)
			for r, b := range got {
				if b < 0 || int(b) >= nb || seen[b] {
					t.Fatalf("%s rows %d keys %v: rank %d holds block %d: not a permutation of %d blocks", c.name, k.rows, k.keys, r, b, nb)
				}
				seen[b] = true
				if nb > orderMax {
					want := nb - 1 - r
					if k.keys {
						want = r
					}
					if int(b) != want {
						t.Fatalf("%s rows %d keys %v: rank %d holds block %d, want %d", c.name, k.rows, k.keys, r, b, want)
					}
					continue
				}
				if r == 0 {
					continue
				}
				p := got[r-1]
				wp, wb := work(cu, tok, k.rows, int(p), k.keys), work(cu, tok, k.rows, int(b), k.keys)
				if wp < wb || wp == wb && p > b {
					t.Fatalf("%s rows %d keys %v: rank %d block %d (work %d) after block %d (work %d)", c.name, k.rows, k.keys, r, b, wb, p, wp)
				}
			}
		}
	}
}
