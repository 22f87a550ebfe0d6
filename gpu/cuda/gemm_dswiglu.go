//go:build cgo

package cuda

import (
	"fmt"
	"os"

	"github.com/rlpipe/rlpipe/gpu"
)

// downSwiGLUOff turns off the down projection's input gradient with
// SwiGLU's backward in one kernel (RLPIPE_CUDA_DOWN_DSWIGLU=0):
// DownSwiGLUBackward then refuses every call, and the model runs the
// product and SwiGLU's backward.
var downSwiGLUOff = os.Getenv("RLPIPE_CUDA_DOWN_DSWIGLU") == "0"

// dsBN is k_gemm_dswiglu_*'s tile width: 192 output columns, three 64-wide
// boxes of the down weight's rows (the other dimensions are the gate/up
// kernel's: gsBM, gsBK, gsStages, gsRow, gsSmem).
const dsBN = 192

// dsThreads is k_gemm_dswiglu_*'s CTA: the gate/up kernel's three
// warpgroups and a fourth for the epilogue.
const dsThreads = 4 * 128

// DownSwiGLUBackward writes dGate and dUp, SwiGLU's backward at gate and
// up of dact = dy·down, in one kernel that never stores dact: dy [T,K],
// down [K,N] (row-major: the down projection's weight), gate, up, dGate
// and dUp [T,N], every operand bf16 (or every one f16), K a multiple of
// 64, N of 8, on Hopper. Its values are those of the product rounded to
// the dtype and then SwiGLUBackward, up to the product's accumulation
// order. Operands it does not take give an error wrapping
// gpu.ErrNotFused.
func (b *Backend) DownSwiGLUBackward(dGate, dUp, dy, down, gate, up gpu.Tensor) error {
	const op = "down swiglu backward"
	if downSwiGLUOff {
		return fmt.Errorf("%s: RLPIPE_CUDA_DOWN_DSWIGLU=0: %w", op, gpu.ErrNotFused)
	}
	if !b.wgmma() {
		return fmt.Errorf("%s: needs Hopper's wgmma: %w", op, gpu.ErrNotFused)
	}
	dt := dy.DType
	if dt != gpu.BF16 && dt != gpu.F16 {
		return fmt.Errorf("%s: dy is %v, want bf16 or f16: %w", op, dt, gpu.ErrNotFused)
	}
	t, k, n, err := gpu.DownSwiGLUBackwardDims(op, dGate, dUp, dy, down, gate, up)
	if err != nil {
		return err
	}
	// The kernel reads and writes 8 columns (16 bytes) at a time.
	if k%gsBK != 0 || n%8 != 0 {
		return fmt.Errorf("%s: K %d not a multiple of %d or N %d not of 8: %w", op, k, gsBK, n, gpu.ErrNotFused)
	}
	as, err := b.fusedAddrs(op, dt, arg("dGate", dGate), arg("dUp", dUp), arg("dy", dy), arg("down", down),
		arg("gate", gate), arg("up", up))
	if err != nil {
		return err
	}
	if t == 0 {
		return nil
	}
	// dy in boxes of 64 columns and gsBM rows; the down weight [K,N] in
	// boxes of 64 of its N columns and gsBK of its K rows.
	s, ms, err := b.persistentStart(tmapKey{as[2], t, 1, k, gsBM}, tmapKey{as[3], k, 1, n, gsBK})
	if err != nil {
		return err
	}
	nb := b.persistentGrid((t + gsBM - 1) / gsBM * ((n + dsBN - 1) / dsBN))
	return b.issue(launch{name: kernel16("k_gemm_dswiglu", dt), gx: nb, gy: 1, gz: 1, bx: dsThreads, by: 1, bz: 1, smem: gsSmem(),
		args: new(kargs).u64(as[0]).u64(as[1]).u64(s.tileCounter()).put(ms[0][:]).put(ms[1][:]).
			u64(as[4]).u64(as[5]).i32(t).i32(n).i32(k)})
}
