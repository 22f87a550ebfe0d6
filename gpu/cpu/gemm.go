package cpu

import (
	"github.com/rlpipe/rlpipe/gpu"
)

// Tile sizes of the blocked GEMM: a task computes an mb×nb tile of c,
// walking k in kb-sized panels converted to float32.
const (
	gemmMB = 64
	gemmNB = 64
	gemmKB = 256
)

// mat is a row-major matrix view.
type mat struct {
	v          fview
	rows, cols int
}

type gemmScratch struct {
	acc, ap, bp, tmp []float32
}

// Gemm computes c = alpha*op(a)@op(b) + beta*c.
func (b *Backend) Gemm(c, a, bm gpu.Tensor, transA, transB bool, alpha, beta float32) error {
	const op = "gemm"
	m, n, _, err := gpu.GemmDims(c, a, bm, transA, transB)
	if err != nil {
		return err
	}
	cv, err := floatView(op, "c", c)
	if err != nil {
		return err
	}
	av, err := floatView(op, "a", a)
	if err != nil {
		return err
	}
	bv, err := floatView(op, "b", bm)
	if err != nil {
		return err
	}
	b.gemm(mat{cv, m, n}, mat{av, a.Shape[0], a.Shape[1]}, mat{bv, bm.Shape[0], bm.Shape[1]}, transA, transB, alpha, beta)
	return nil
}

// gemm is Gemm on checked views.
func (b *Backend) gemm(c, a, bm mat, transA, transB bool, alpha, beta float32) {
	m, n := c.rows, c.cols
	k := a.cols
	if transA {
		k = a.rows
	}
	if m == 0 || n == 0 {
		return
	}
	tilesM := (m + gemmMB - 1) / gemmMB
	tilesN := (n + gemmNB - 1) / gemmNB
	newScratch := func() *gemmScratch {
		return &gemmScratch{
			acc: make([]float32, gemmMB*gemmNB),
			ap:  make([]float32, gemmMB*gemmKB),
			bp:  make([]float32, gemmKB*gemmNB),
			tmp: make([]float32, max(gemmMB, gemmNB, gemmKB)),
		}
	}
	tasks(b, tilesM*tilesN, newScratch, func(s *gemmScratch, t int) {
		i0, j0 := (t/tilesN)*gemmMB, (t%tilesN)*gemmNB
		mb, nb := min(gemmMB, m-i0), min(gemmNB, n-j0)
		acc := s.acc[:mb*nb]
		clear(acc)
		for k0 := 0; k0 < k; k0 += gemmKB {
			kb := min(gemmKB, k-k0)
			ap, bp := s.ap[:mb*kb], s.bp[:kb*nb]
			if !transA { // a is [m,k]
				for i := range mb {
					a.v.load(ap[i*kb:(i+1)*kb], (i0+i)*k+k0)
				}
			} else { // a is [k,m]
				tmp := s.tmp[:mb]
				for kk := range kb {
					a.v.load(tmp, (k0+kk)*m+i0)
					for i, x := range tmp {
						ap[i*kb+kk] = x
					}
				}
			}
			if !transB { // b is [k,n]
				for kk := range kb {
					bm.v.load(bp[kk*nb:(kk+1)*nb], (k0+kk)*n+j0)
				}
			} else { // b is [n,k]
				tmp := s.tmp[:kb]
				for j := range nb {
					bm.v.load(tmp, (j0+j)*k+k0)
					for kk, x := range tmp {
						bp[kk*nb+j] = x
					}
				}
			}
			kernel(acc, ap, bp, mb, nb, kb)
		}
		out := s.tmp[:nb]
		for i := range mb {
			row := acc[i*nb : (i+1)*nb]
			off := (i0+i)*n + j0
			if beta == 0 {
				for j, x := range row {
					out[j] = alpha * x
				}
			} else {
				c.v.load(out, off)
				for j, x := range row {
					out[j] = float32(alpha*x) + float32(beta*out[j])
				}
			}
			c.v.store(off, out)
		}
	})
}

// kernel accumulates acc[mb×nb] += ap[mb×kb] @ bp[kb×nb], four rows at a
// time so that each loaded row of bp serves four rows of acc.
func kernel(acc, ap, bp []float32, mb, nb, kb int) {
	i := 0
	for ; i+4 <= mb; i += 4 {
		c0 := acc[i*nb : (i+1)*nb]
		c1 := acc[(i+1)*nb : (i+2)*nb]
		c2 := acc[(i+2)*nb : (i+3)*nb]
		c3 := acc[(i+3)*nb : (i+4)*nb]
		a0 := ap[i*kb : (i+1)*kb]
		a1 := ap[(i+1)*kb : (i+2)*kb]
		a2 := ap[(i+2)*kb : (i+3)*kb]
		a3 := ap[(i+3)*kb : (i+4)*kb]
		for kk := range kb {
			x0, x1, x2, x3 := a0[kk], a1[kk], a2[kk], a3[kk]
			br := bp[kk*nb : (kk+1)*nb]
			br = br[:len(c0)]
			c1 = c1[:len(c0)]
			c2 = c2[:len(c0)]
			c3 = c3[:len(c0)]
			for j, y := range br {
				c0[j] += x0 * y
				c1[j] += x1 * y
				c2[j] += x2 * y
				c3[j] += x3 * y
			}
		}
	}
	for ; i < mb; i++ {
		c0 := acc[i*nb : (i+1)*nb]
		a0 := ap[i*kb : (i+1)*kb]
		for kk, x := range a0 {
			br := bp[kk*nb : (kk+1)*nb]
			br = br[:len(c0)]
			for j, y := range br {
				c0[j] += x * y
			}
		}
	}
}

// AddBias adds b [N] to every row of y [T,N].
func (b *Backend) AddBias(y, bias gpu.Tensor) error {
	const op = "addbias"
	t, n, err := gpu.BiasDims(op, false, y, bias)
	if err != nil {
		return err
	}
	yv, err := floatView(op, "y", y)
	if err != nil {
		return err
	}
	bv, err := floatView(op, "b", bias)
	if err != nil {
		return err
	}
	bf := make([]float32, n)
	bv.load(bf, 0)
	b.parallel(t, max(1, 4096/max(n, 1)), func(_, lo, hi int) {
		buf := make([]float32, n)
		for r := lo; r < hi; r++ {
			row := yv.get(buf, r*n, n)
			for j, x := range bf {
				row[j] += x
			}
			yv.store(r*n, row)
		}
	})
	return nil
}

// BiasGrad accumulates the column sums of dy [T,N] into db [N].
func (b *Backend) BiasGrad(db, dy gpu.Tensor) error {
	const op = "biasgrad"
	t, n, err := gpu.BiasDims(op, true, dy, db)
	if err != nil {
		return err
	}
	dbv, err := floatView(op, "db", db)
	if err != nil {
		return err
	}
	dyv, err := floatView(op, "dy", dy)
	if err != nil {
		return err
	}
	// Columns are independent: split them across workers.
	b.parallel(n, 256, func(_, lo, hi int) {
		w := hi - lo
		sum := make([]float64, w)
		buf := make([]float32, w)
		for r := range t {
			for j, x := range dyv.get(buf, r*n+lo, w) {
				sum[j] += float64(x)
			}
		}
		for j := range w {
			dbv.set(lo+j, float32(float64(dbv.at(lo+j))+sum[j]))
		}
	})
	return nil
}
