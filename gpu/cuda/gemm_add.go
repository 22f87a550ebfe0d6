//go:build cgo

package cuda

import (
	"fmt"
	"os"

	"github.com/rlpipe/rlpipe/gpu"
)

// gemmAddOff turns GemmAdd off (RLPIPE_CUDA_GEMM_ADD=0): it then refuses
// every call, and the model runs the product and the add apart.
var gemmAddOff = os.Getenv("RLPIPE_CUDA_GEMM_ADD") == "0"

// GemmAdd computes d = c + op(a)@op(bm) in one cuBLASLt product, c read in
// its epilogue (beta 1): the sum of c and the float32 product is rounded
// once to d's dtype, where Gemm and Add round the product first and then
// the sum. d and c have one shape and dtype; d may be c itself and
// overlaps neither a nor bm. Operand dtypes cuBLASLt does not combine give
// an error wrapping gpu.ErrNotFused, as does RLPIPE_CUDA_GEMM_ADD=0.
func (b *Backend) GemmAdd(d, c, a, bm gpu.Tensor, transA, transB bool) error {
	const op = "gemm add"
	if gemmAddOff {
		return fmt.Errorf("%s: RLPIPE_CUDA_GEMM_ADD=0: %w", op, gpu.ErrNotFused)
	}
	m, n, _, err := gpu.GemmDims(d, a, bm, transA, transB)
	if err != nil {
		return err
	}
	if err := gpu.CheckShape(op, "c", c, m, n); err != nil {
		return err
	}
	if err := gpu.CheckAlias(op, "d", "c", d, c); err != nil {
		return err
	}
	if c.DType != d.DType {
		return fmt.Errorf("%s: c is %v and d %v", op, c.DType, d.DType)
	}
	if !ltSupported(d.DType, a.DType, bm.DType) {
		return fmt.Errorf("%s: %v@%v->%v: %w", op, a.DType, bm.DType, d.DType, gpu.ErrNotFused)
	}
	da, err := b.faddr(op, "d", d)
	if err != nil {
		return err
	}
	mc, ma, mb, err := b.gemmMats(op, c, a, bm, m, n)
	if err != nil {
		return err
	}
	return b.matmulTo(da, mc, ma, mb, transA, transB, 1, 1)
}
