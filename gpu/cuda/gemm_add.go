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
	var as [4]uint64
	for i, o := range []named{arg("d", d), arg("c", c), arg("a", a), arg("b", bm)} {
		if as[i], err = b.faddr(op, o.Name, o.T); err != nil {
			return err
		}
	}
	return b.matmulTo(as[0], mat{as[1], c.DType, m, n, int64(n)}, mat{as[2], a.DType, a.Shape[0], a.Shape[1], int64(a.Shape[1])},
		mat{as[3], bm.DType, bm.Shape[0], bm.Shape[1], int64(bm.Shape[1])}, transA, transB, 1, 1)
}
