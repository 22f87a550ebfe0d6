//go:build cgo

package cuda

/*
#include "rlcuda.h"
*/
import "C"

import (
	"fmt"
	"math/bits"

	"github.com/rlpipe/rlpipe/gpu"
)

// mat is a row-major matrix operand: rows×cols elements at device address a
// with a row stride of ld elements.
type mat struct {
	a          uint64
	dt         gpu.DType
	rows, cols int
	ld         int64
}

// ltKey identifies a cuBLASLt problem for the algorithm cache.
type ltKey struct {
	m, n, k                uint64
	lda, ldb, ldc          int64
	ta, tb, at, bt, ct     int32
	alignA, alignB, alignC uint32
	alignD                 uint32 // 0 where D is C
	ws                     bool
}

// cudaDataType returns the cudaDataType_t code of a float dtype.
func cudaDataType(d gpu.DType) int32 {
	switch d {
	case gpu.F16:
		return 2 // CUDA_R_16F
	case gpu.BF16:
		return 14 // CUDA_R_16BF
	}
	return 0 // CUDA_R_32F
}

const (
	cublasCompute32F = 68 // CUBLAS_COMPUTE_32F: float32 accumulation, no TF32.
	cudaR32F         = 0
)

// alignOf returns the largest power of two (at most 256) dividing a.
func alignOf(a uint64) uint32 {
	if a == 0 {
		return 256
	}
	return uint32(1) << min(bits.TrailingZeros64(a), 8)
}

// ltSupported reports whether cuBLASLt computes this dtype combination with
// float32 compute: A and B of one type, C of that type or F32.
func ltSupported(c, a, bm gpu.DType) bool {
	return a == bm && a.IsFloat() && (c == a || c == gpu.F32)
}

// matmul computes c = alpha*op(a)@op(bm) + beta*c on the view's stream:
// through cuBLASLt (CUBLAS_COMPUTE_32F, so TF32 is never used) when it
// supports the dtypes, else through the SIMT k_gemm kernel. Row-major
// operands are handed to column-major cuBLASLt as their transposes: cᵀ =
// op(b)ᵀ op(a)ᵀ.
func (b *Backend) matmul(c, a, bm mat, transA, transB bool, alpha, beta float32) error {
	return b.matmulTo(0, c, a, bm, transA, transB, alpha, beta)
}

// matmulTo is matmul writing d = alpha*op(a)@op(bm) + beta*c to the
// address d (of c's dtype and layout) where d is not 0, through cuBLASLt
// only: the SIMT kernel writes C in place.
func (b *Backend) matmulTo(d uint64, c, a, bm mat, transA, transB bool, alpha, beta float32) error {
	m, k := a.rows, a.cols
	if transA {
		m, k = k, m
	}
	n := bm.cols
	if transB {
		n = bm.rows
	}
	if m == 0 || n == 0 {
		return nil
	}
	s, err := b.stream()
	if err != nil {
		return err
	}
	if k == 0 || !ltSupported(c.dt, a.dt, bm.dt) {
		if d != 0 {
			return fmt.Errorf("gemm %dx%dx%d (%v@%v->%v) to a separate output: cuBLASLt does not take these operands", m, n, k, a.dt, bm.dt, c.dt)
		}
		gx, gy := uint32((n+63)/64), uint32((m+63)/64)
		if gy > 65535 {
			return fmt.Errorf("gemm: %d rows exceed the fallback kernel's grid", m)
		}
		args := new(kargs).u64(c.a).dt(c.dt).i64(c.ld).u64(a.a).dt(a.dt).i64(a.ld).i32(b2i(transA)).
			u64(bm.a).dt(bm.dt).i64(bm.ld).i32(b2i(transB)).i32(m).i32(n).i32(k).f32(alpha).f32(beta)
		return b.d.do(func() error {
			return b.d.run(s, launch{name: "k_gemm", gx: gx, gy: gy, gz: 1, bx: 256, by: 1, bz: 1, args: args})
		})
	}
	var call C.rlLtCall
	call.stream = C.uint64_t(s.h)
	call.a, call.b, call.c, call.d = C.uint64_t(bm.a), C.uint64_t(a.a), C.uint64_t(c.a), C.uint64_t(d)
	call.arows, call.acols, call.lda = C.uint64_t(bm.cols), C.uint64_t(bm.rows), C.int64_t(bm.ld)
	call.brows, call.bcols, call.ldb = C.uint64_t(a.cols), C.uint64_t(a.rows), C.int64_t(a.ld)
	call.m, call.n, call.ldc = C.uint64_t(n), C.uint64_t(m), C.int64_t(c.ld)
	call.transa, call.transb = C.int32_t(b2i(transB)), C.int32_t(b2i(transA))
	call.atype, call.btype, call.ctype = C.int32_t(cudaDataType(bm.dt)), C.int32_t(cudaDataType(a.dt)), C.int32_t(cudaDataType(c.dt))
	call.computeType, call.scaleType = cublasCompute32F, cudaR32F
	call.alignA, call.alignB, call.alignC = C.uint32_t(alignOf(bm.a)), C.uint32_t(alignOf(a.a)), C.uint32_t(alignOf(c.a))
	if d != 0 {
		call.alignD = C.uint32_t(alignOf(d))
	}
	call.alpha, call.beta = C.float(alpha), C.float(beta)
	key := ltKey{m: uint64(call.m), n: uint64(call.n), k: uint64(k), lda: bm.ld, ldb: a.ld, ldc: c.ld,
		ta: int32(call.transa), tb: int32(call.transb), at: int32(call.atype), bt: int32(call.btype), ct: int32(call.ctype),
		alignA: uint32(call.alignA), alignB: uint32(call.alignB), alignC: uint32(call.alignC), alignD: uint32(call.alignD),
		ws: s.workspace}
	return b.d.do(func() error {
		if b.d.released {
			return errReleased
		}
		call.handle = b.d.lt
		if s.workspace {
			call.workspace, call.wsSize = C.uint64_t(b.d.internal), workspaceBytes
		}
		if ltPick >= 0 {
			call.pick = C.int32_t(ltPick)
		} else if algo, ok := b.d.algos[key]; ok {
			call.algo, call.haveAlgo = algo, 1
		}
		var stage C.int
		st := C.rl_lt_matmul(&call, &stage)
		ltOffered = int(call.got)
		if st != 0 {
			steps := []string{"cublasLtMatmulDescCreate", "cublasLtMatmulDescSetAttribute", "cublasLtMatrixLayoutCreate",
				"cublasLtMatmulPreference", "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmul"}
			return fmt.Errorf("gemm %dx%dx%d (%v@%v->%v): %w", m, n, k, a.dt, bm.dt, c.dt, ltErr(steps[int(stage)], st))
		}
		if ltPick < 0 {
			b.d.algos[key] = call.algo
		}
		return nil
	})
}

// ltPick, when 0 or more, makes matmul take the cuBLASLt heuristic's
// ltPick-th candidate for every product, without the algorithm cache; a
// test hook (BenchmarkGemmAlgos) that times the candidates the heuristic
// ranks below its first. ltOffered is the number of candidates the last
// heuristic query offered. Both belong to the device worker's thread.
var (
	ltPick    = -1
	ltOffered int
)

func b2i(v bool) int {
	if v {
		return 1
	}
	return 0
}

// Gemm computes c = alpha*op(a)@op(b) + beta*c with float32 accumulation.
// Operands whose dtypes cuBLASLt cannot combine (A and B of different
// types, or a 16-bit C of another type) go through a SIMT kernel instead.
func (b *Backend) Gemm(c, a, bm gpu.Tensor, transA, transB bool, alpha, beta float32) error {
	const op = "gemm"
	m, n, _, err := gpu.GemmDims(c, a, bm, transA, transB)
	if err != nil {
		return err
	}
	mc, ma, mb, err := b.gemmMats(op, c, a, bm, m, n)
	if err != nil {
		return err
	}
	return b.matmul(mc, ma, mb, transA, transB, alpha, beta)
}

// gemmMats returns the row-major matrices of Gemm's checked operands: c
// [m,n], and a and bm as they are stored.
func (b *Backend) gemmMats(op string, c, a, bm gpu.Tensor, m, n int) (mc, ma, mb mat, err error) {
	var as [3]uint64
	for i, o := range []named{arg("c", c), arg("a", a), arg("b", bm)} {
		if as[i], err = b.faddr(op, o.Name, o.T); err != nil {
			return mc, ma, mb, err
		}
	}
	return mat{as[0], c.DType, m, n, int64(n)}, mat{as[1], a.DType, a.Shape[0], a.Shape[1], int64(a.Shape[1])},
		mat{as[2], bm.DType, bm.Shape[0], bm.Shape[1], int64(bm.Shape[1])}, nil
}
