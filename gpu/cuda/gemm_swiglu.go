//go:build cgo

package cuda

import (
	"fmt"
	"os"

	"github.com/rlpipe/rlpipe/gpu"
)

// The gate/up product with SwiGLU in its epilogue (k_gemm_swiglu_*,
// kernels/gemm.cu): persistent CTAs of gsThreads threads take tiles of gsBM
// rows and gsBN output columns from the stream's tile queue
// (kernels/hopper.cuh; the counter is Stream.tileCounter), with gsStages buffers of a gsBK-wide step
// of the reduction (x's rows and the gate's and up's, 16-bit) and a staging
// tile of gsBM rows of gsRow bytes for the epilogue.
const (
	gsBM, gsBN, gsBK = 128, 96, 64
	gsStages         = 4
	gsRow            = 400
	gsThreads        = 3 * 128
)

// gateUpSwiGLUOff turns the fused kernel off (RLPIPE_CUDA_GEMM_SWIGLU=0):
// GateUpSwiGLU then refuses every call, and the model runs the two
// products and SwiGLU.
var gateUpSwiGLUOff = os.Getenv("RLPIPE_CUDA_GEMM_SWIGLU") == "0"

// gateUpKeepOn says whether forwards that a backward follows take the fused
// kernel too (GateUpSwiGLUKeep). RLPIPE_CUDA_GEMM_SWIGLU_KEEP=0 turns it
// off: GateUpSwiGLUKeep then refuses every call, and those forwards run
// the two products and SwiGLU.
var gateUpKeepOn = os.Getenv("RLPIPE_CUDA_GEMM_SWIGLU_KEEP") != "0"

// GateUpSwiGLU writes act = SwiGLU(x·gateᵀ, x·upᵀ) in one kernel: x [T,K],
// gate and up [N,K], act [T,N], every operand bf16 (or every one f16),
// K a multiple of 64, N of 8, on Hopper. Its values are those of the two
// products rounded to the dtype and then SwiGLU, up to the products'
// accumulation order. Operands it does not take give an error wrapping
// gpu.ErrNotFused.
func (b *Backend) GateUpSwiGLU(act, x, gate, up gpu.Tensor) error {
	const op = "gate/up swiglu"
	if err := b.gateUpTakes(op, x); err != nil {
		return err
	}
	t, k, n, err := gpu.GateUpSwiGLUDims(op, act, x, gate, up)
	if err != nil {
		return err
	}
	return b.gateUpSwiGLU(op, t, k, n, act, gpu.Tensor{}, gpu.Tensor{}, x, gate, up)
}

// GateUpSwiGLUKeep is GateUpSwiGLU for a forward that a backward follows:
// the same kernel also stores the two products, rounded to the dtype, in
// gOut and uOut [T,N] (act's bits are SwiGLU's of them). Its operands are
// GateUpSwiGLU's and the two outputs, which overlap nothing. With
// RLPIPE_CUDA_GEMM_SWIGLU_KEEP=0 it refuses every call (gpu.ErrNotFused).
func (b *Backend) GateUpSwiGLUKeep(act, gOut, uOut, x, gate, up gpu.Tensor) error {
	const op = "gate/up swiglu keep"
	if !gateUpKeepOn {
		return fmt.Errorf("%s: RLPIPE_CUDA_GEMM_SWIGLU_KEEP=0: %w", op, gpu.ErrNotFused)
	}
	if err := b.gateUpTakes(op, x); err != nil {
		return err
	}
	t, k, n, err := gpu.GateUpSwiGLUKeepDims(op, act, gOut, uOut, x, gate, up)
	if err != nil {
		return err
	}
	return b.gateUpSwiGLU(op, t, k, n, act, gOut, uOut, x, gate, up)
}

// gateUpTakes refuses, with an error wrapping gpu.ErrNotFused, where the
// fused kernel does not run: switched off, not Hopper, or x not 16-bit.
func (b *Backend) gateUpTakes(op string, x gpu.Tensor) error {
	if gateUpSwiGLUOff {
		return fmt.Errorf("%s: RLPIPE_CUDA_GEMM_SWIGLU=0: %w", op, gpu.ErrNotFused)
	}
	if !b.wgmma() {
		return fmt.Errorf("%s: needs Hopper's wgmma: %w", op, gpu.ErrNotFused)
	}
	if dt := x.DType; dt != gpu.BF16 && dt != gpu.F16 {
		return fmt.Errorf("%s: x is %v, want bf16 or f16: %w", op, dt, gpu.ErrNotFused)
	}
	return nil
}

// gateUpSwiGLU launches k_gemm_swiglu_* on checked operands of T rows, K
// and N, storing the products too where gOut is present.
func (b *Backend) gateUpSwiGLU(op string, t, k, n int, act, gOut, uOut, x, gate, up gpu.Tensor) error {
	// The kernel writes 8 columns (16 bytes) at a time.
	if k%gsBK != 0 || n%8 != 0 {
		return fmt.Errorf("%s: K %d not a multiple of %d or N %d not of 8: %w", op, k, gsBK, n, gpu.ErrNotFused)
	}
	dt := x.DType
	ops := []named{arg("act", act), arg("x", x), arg("gate", gate), arg("up", up)}
	if gOut.Mem != nil {
		ops = append(ops, arg("gate_out", gOut), arg("up_out", uOut))
	}
	as, err := b.fusedAddrs(op, dt, ops...)
	if err != nil {
		return err
	}
	as = append(as, 0, 0) // no products kept: null
	if t == 0 {
		return nil
	}
	s, ms, err := b.persistentStart(tmapKey{as[1], t, 1, k, gsBM}, tmapKey{as[2], n, 1, k, gsBN}, tmapKey{as[3], n, 1, k, gsBN})
	if err != nil {
		return err
	}
	nb := b.persistentGrid((t + gsBM - 1) / gsBM * ((n + gsBN - 1) / gsBN))
	return b.issue(launch{name: kernel16("k_gemm_swiglu", dt), gx: nb, gy: 1, gz: 1, bx: gsThreads, by: 1, bz: 1, smem: gsSmem(),
		args: new(kargs).u64(as[0]).u64(as[4]).u64(as[5]).u64(s.tileCounter()).put(ms[0][:]).put(ms[1][:]).put(ms[2][:]).
			i32(t).i32(n).i32(k)})
}

// gsSmem is k_gemm_swiglu_*'s dynamic shared memory: gsStages buffers of
// x's, the gate's and up's tiles, the staging tile, a "full" and an
// "empty" mbarrier per buffer, a "staged" and a "drained" one, the tile
// queue, and 1 KB to align the tiles to 1024 bytes.
func gsSmem() int {
	return gsStages*(gsBM+2*gsBN)*gsBK*2 + gsBM*gsRow + (2*gsStages+2)*8 + tileQueueBytes + 1024
}
