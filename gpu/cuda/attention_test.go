//go:build cgo

package cuda

import (
	"fmt"
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
func TestAttentionTensorCore(t *testing.T) {
	paths := []bool{true}
	if e := newEnv(t); e.g.d.info.Hopper() {
		paths = []bool{false, true}
	}
	for _, noWgmma := range paths {
		name := "wgmma"
		if noWgmma {
			name = "mma.sync"
		}
		t.Run(name, func(t *testing.T) {
			attnNoWgmma = noWgmma
			defer func() { attnNoWgmma = false }()
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
// compute capability 9.0 with the CTA sizes and shared memory the kernels
// assume, within the H100's 227 KB a block may use; the mma.sync ones
// elsewhere and under attnNoWgmma.
func TestTensorCoreLaunch(t *testing.T) {
	hopper := &Backend{d: &device{info: DeviceInfo{CCMajor: 9, CCMinor: 0}}}
	ampere := &Backend{d: &device{info: DeviceInfo{CCMajor: 8, CCMinor: 0}}}
	const tokens, heads, faSmem = 1000, 12, 777
	for _, c := range []struct {
		b         *Backend
		noWgmma   bool
		op        string
		d         int
		name      string
		gx, bx    uint32
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
		l := c.b.tcLaunch(c.op, fmt.Sprintf("bf16_%d", c.d), c.d, tokens, heads, faSmem, nil)
		attnNoWgmma = false
		if l.name != c.name || l.gx != c.gx || l.gy != heads || l.bx != c.bx {
			t.Errorf("%s d%d (cc %d.%d, noWgmma %v): got %s grid %d×%d block %d, want %s grid %d×%d block %d",
				c.op, c.d, c.b.d.info.CCMajor, c.b.d.info.CCMinor, c.noWgmma, l.name, l.gx, l.gy, l.bx, c.name, c.gx, heads, c.bx)
		}
		if c.smem != 0 && l.smem != c.smem {
			t.Errorf("%s: shared memory %d, want %d", l.name, l.smem, c.smem)
		}
		if c.max != 0 && (l.smem > c.max || l.smem < 1024) {
			t.Errorf("%s: shared memory %d outside (1024, %d]", l.name, l.smem, c.max)
		}
	}
	if got, want := (DeviceInfo{CCMajor: 9}).Arch(), "sm_90a"; got != want {
		t.Errorf("Arch of 9.0 = %q, want %q", got, want)
	}
	if got, want := (DeviceInfo{CCMajor: 8, CCMinor: 6}).Arch(), "sm_86"; got != want {
		t.Errorf("Arch of 8.6 = %q, want %q", got, want)
	}
}
