//go:build cgo

package cuda

import (
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// The choice between the scalar and the 8-wide kernels needs no GPU.
func TestVec8(t *testing.T) {
	for _, c := range []struct {
		n    int64
		as   []uint64
		want bool
	}{
		{16, []uint64{0x1000, 0x2000}, true},
		{0, []uint64{0x1000}, true},
		{12, []uint64{0x1000}, false},
		{16, []uint64{0x1000, 0x2008}, false},
		{16, []uint64{0x1004}, false},
		{8, nil, true},
	} {
		if got := vec8(c.n, c.as...); got != c.want {
			t.Errorf("vec8(%d, %#x) = %v, want %v", c.n, c.as, got, c.want)
		}
	}
}

func TestGroupBlock(t *testing.T) {
	for _, c := range []struct {
		ng, limit int64
		want      uint32
	}{
		{1, 512, 32}, {112, 512, 128}, {192, 512, 192}, {512, 512, 512}, {640, 512, 512}, {1125, 1024, 1024},
	} {
		if got := groupBlock(c.ng, c.limit); got != c.want {
			t.Errorf("groupBlock(%d, %d) = %d, want %d", c.ng, c.limit, got, c.want)
		}
	}
}

// ropeTokens keeps a k_rope8 block's cos and sin tables within 4096
// entries and its work near 1024 groups of 8 pairs.
func TestRoPETokens(t *testing.T) {
	for _, c := range []struct{ heads, d, want int }{
		{12, 128, 11}, {2, 128, 16}, {14, 64, 16}, {40, 128, 4}, {1, 512, 16}, {64, 512, 1}, {6, 96, 16},
	} {
		got := ropeTokens(c.heads, c.d)
		if got != c.want || got*c.d/2 > 4096 {
			t.Errorf("ropeTokens(%d, %d) = %d, want %d", c.heads, c.d, got, c.want)
		}
	}
}

func TestEmbeddingBuckets(t *testing.T) {
	for _, c := range []struct{ cols, sms, want int64 }{
		{12, 132, 44}, {1, 132, 64}, {28, 132, 18}, {1000, 132, 1}, {12, 0, 1},
	} {
		if got := embeddingBuckets(c.cols, c.sms); got != c.want {
			t.Errorf("embeddingBuckets(%d, %d) = %d, want %d", c.cols, c.sms, got, c.want)
		}
	}
}

// kernelModules returns the module of every kernel the modules define,
// failing t where a module's __global__ functions and the kernel names
// found in it differ in number (the driver looks each name up when the
// module loads), a name is not a kernel's (a keyword the pattern
// swallowed), or two modules define one name.
func kernelModules(t *testing.T) map[string]string {
	t.Helper()
	mods, err := modules()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, m := range mods {
		src := m.src[strings.Index(m.src, "#line 1"):]
		if n := strings.Count(src, "__global__"); n != len(m.funcs) {
			t.Errorf("%s: %d __global__ functions, %d kernel names found: %v", m.name, n, len(m.funcs), m.funcs)
		}
		for _, f := range m.funcs {
			if strings.HasPrefix(f, "__") || !strings.HasPrefix(f, "k_") {
				t.Errorf("%s: kernel name %q", m.name, f)
			}
			if o, dup := seen[f]; dup {
				t.Errorf("kernel %s is in both %s and %s", f, o, m.name)
			}
			seen[f] = m.name
		}
	}
	return seen
}

// Every kernel the Go side names directly is defined (kernelModules checks
// the names as found).
func TestKernelNames(t *testing.T) {
	seen := kernelModules(t)
	for _, f := range []string{"k_lp_bwd", "k_lp_bwd8", "k_rope8", "k_colsum8_part", "k_embedding_bwd_b", "k_rmsnorm8", "k_rmsnorm_bwd8_1", "k_rmsnorm_bwd8_1a", "k_rmsnorm_bwd8_2", "k_swiglu8", "k_cast8", "k_qkv_split8_bf16", "k_qkv_split8_f16", "k_qkv_pack8_bf16", "k_qkv_pack8_f16", "k_rmsnorm_r4_bf16", "k_rmsnorm_r16_f16", "k_lp_head_bf16", "k_lp_head_f16", "k_lp_combine", "k_gemm_qkv_bf16", "k_gemm_qkv_f16", "k_rope_cs16_bf16", "k_rope_cs16_f16", "k_adamw", "k_adamw4", "k_adamw4_16", "k_sumsq", "k_sumsq8"} {
		if seen[f] == "" {
			t.Errorf("kernel %s not found", f)
		}
	}
}

// AdamW and SumSquares take their vector kernels exactly where the operands
// allow them, and name kernels that exist.
func TestVectorKernels(t *testing.T) {
	if scalarOnly {
		t.Skip("RLPIPE_CUDA_SCALAR=1: every op takes its scalar kernel")
	}
	have := kernelModules(t)
	for _, c := range []struct {
		n         int64
		gd        gpu.DType
		as        []uint64
		want      string
		wantUnits int64
	}{
		{1024, gpu.F32, []uint64{0, 4096, 8192, 12288}, "k_adamw4", 256},
		{1028, gpu.F32, []uint64{256, 512, 768, 1024}, "k_adamw4", 257},
		{1026, gpu.F32, []uint64{0, 4096, 8192, 12288}, "k_adamw", 1026},
		{1024, gpu.F32, []uint64{0, 4100, 8192, 12288}, "k_adamw", 1024},
		{1024, gpu.F32, []uint64{0, 4104, 8192, 12288}, "k_adamw", 1024},
		{1024, gpu.F32, []uint64{8, 4096, 8192, 12288}, "k_adamw", 1024},
		{1024, gpu.BF16, []uint64{0, 4104, 8192, 12288}, "k_adamw4_16", 256},
		{1024, gpu.F16, []uint64{0, 4096, 8192, 12288}, "k_adamw4_16", 256},
		{1024, gpu.BF16, []uint64{0, 4100, 8192, 12288}, "k_adamw", 1024},
		{1026, gpu.BF16, []uint64{0, 4096, 8192, 12288}, "k_adamw", 1026},
		{1024, gpu.BF16, []uint64{0, 4096, 8200, 12288}, "k_adamw", 1024},
	} {
		name, units := adamwKernel(c.n, c.gd, c.as...)
		if name != c.want || units != c.wantUnits || have[name] == "" {
			t.Errorf("adamwKernel(%d, %v, %v) = %s, %d; want %s, %d (a kernel)", c.n, c.gd, c.as, name, units, c.want, c.wantUnits)
		}
	}
	d := &device{info: DeviceInfo{SMs: 132}}
	for _, c := range []struct {
		n    int64
		a    uint64
		want string
		grid uint32
	}{
		{77077, 0, "k_sumsq8", 19},
		{77077, 4, "k_sumsq", 302},
		{50_000_000, 256, "k_sumsq8", sumPartials},
		{0, 0, "k_sumsq8", 1},
	} {
		name, grid := d.sumSquaresKernel(c.n, c.a)
		if name != c.want || grid != c.grid || have[name] == "" {
			t.Errorf("sumSquaresKernel(%d, %d) = %s, %d; want %s, %d (a kernel)", c.n, c.a, name, grid, c.want, c.grid)
		}
	}
}

// normRowKernel takes the warp-per-row forward for float32 rows of 33 to
// 512 column groups into a 16-bit dtype shared with the weights, with the
// fewest groups a lane that hold the row, and every name it gives is a
// kernel.
func TestNormRowKernel(t *testing.T) {
	have := kernelModules(t)
	for _, c := range []struct {
		h          int64
		xd, dd, wd gpu.DType
		want       string
	}{
		{2048, gpu.F32, gpu.BF16, gpu.BF16, "k_rmsnorm_r8_bf16"},
		{896, gpu.F32, gpu.F16, gpu.F16, "k_rmsnorm_r4_f16"},
		{1024, gpu.F32, gpu.BF16, gpu.BF16, "k_rmsnorm_r4_bf16"},
		{1032, gpu.F32, gpu.BF16, gpu.BF16, "k_rmsnorm_r8_bf16"},
		{3584, gpu.F32, gpu.BF16, gpu.BF16, "k_rmsnorm_r16_bf16"},
		{4096, gpu.F32, gpu.F16, gpu.F16, "k_rmsnorm_r16_f16"},
		{4104, gpu.F32, gpu.BF16, gpu.BF16, ""},
		{256, gpu.F32, gpu.BF16, gpu.BF16, ""},
		{2048, gpu.BF16, gpu.BF16, gpu.BF16, ""},
		{2048, gpu.F32, gpu.BF16, gpu.F16, ""},
		{2048, gpu.F32, gpu.F32, gpu.F32, ""},
	} {
		got, ok := normRowKernel(c.h, c.xd, c.dd, c.wd)
		if got != c.want || ok != (c.want != "") {
			t.Errorf("normRowKernel(%d, %v, %v, %v) = %q, %v; want %q", c.h, c.xd, c.dd, c.wd, got, ok, c.want)
		}
		if ok && have[got] == "" {
			t.Errorf("normRowKernel gave %s, which no module has", got)
		}
	}
}

// qkvKernel takes a 16-bit form only for an 8-wide launch whose operands
// all share that dtype, and every name it gives is a kernel.
func TestQKVKernel(t *testing.T) {
	have := kernelModules(t)
	for _, c := range []struct {
		base string
		vec  bool
		dt   gpu.DType
		same bool
		want string
	}{
		{"k_qkv_split", true, gpu.BF16, true, "k_qkv_split8_bf16"},
		{"k_qkv_split", true, gpu.F16, true, "k_qkv_split8_f16"},
		{"k_qkv_split", true, gpu.BF16, false, "k_qkv_split8"},
		{"k_qkv_split", true, gpu.F32, true, "k_qkv_split8"},
		{"k_qkv_split", false, gpu.BF16, true, "k_qkv_split"},
		{"k_qkv_pack", true, gpu.BF16, true, "k_qkv_pack8_bf16"},
		{"k_qkv_pack", true, gpu.F16, true, "k_qkv_pack8_f16"},
		{"k_qkv_pack", true, gpu.F32, true, "k_qkv_pack8"},
		{"k_qkv_pack", false, gpu.F16, true, "k_qkv_pack"},
	} {
		got := qkvKernel(c.base, c.vec, c.dt, c.same)
		if got != c.want {
			t.Errorf("qkvKernel(%s, vec %v, %v, same %v) = %s, want %s", c.base, c.vec, c.dt, c.same, got, c.want)
		}
		if have[got] == "" {
			t.Errorf("qkvKernel gives %s, which no module defines", got)
		}
	}
}

// resident gives each kernel the blocks an SM holds at once: at least one
// and no more than the SM's 2048 threads allow (every NVIDIA GPU since
// Volta holds at most that many); a kernel that does not exist, or a block
// larger than any kernel may have, is an error.
func TestResidentBlocks(t *testing.T) {
	b := backend(t)
	for _, c := range []struct {
		name    string
		threads uint32
	}{{"k_rmsnorm_bwd8_1a", 192}, {"k_rmsnorm_bwd8_1a", 256}, {"k_rmsnorm_bwd8_1", 192}, {"k_rmsnorm_bwd8_w", 256}} {
		n, err := b.d.resident(c.name, c.threads)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s, %d threads: %d blocks an SM", c.name, c.threads, n)
		if n < 1 || n*int(c.threads) > 2048 {
			t.Errorf("%s, %d threads: %d blocks an SM", c.name, c.threads, n)
		}
	}
	if _, err := b.d.resident("k_no_such_kernel", 128); err == nil {
		t.Error("resident of a kernel that does not exist: no error")
	}
	if n, err := b.d.resident("k_rmsnorm_bwd8_1a", 2048); err == nil {
		t.Errorf("resident of blocks of 2048 threads: %d, no error", n)
	}
}
