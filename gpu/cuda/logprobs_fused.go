//go:build cgo

package cuda

import (
	"fmt"
	"os"

	"github.com/rlpipe/rlpipe/gpu"
)

// The log-prob head without float32 logits in memory (k_lp_head_*, then
// k_lp_combine; kernels/lphead.cu): persistent CTAs of lhThreads threads
// take tiles of lhBM rows and lhBN vocabulary columns from the stream's tile
// queue (kernels/hopper.cuh; the counter is Stream.tileCounter), with lhStages
// buffers of an lhBK-wide step of the hidden dimension.
const (
	lhBM, lhBN, lhBK = 128, 256, 64
	lhStages         = 4
	lhThreads        = 3 * 128
)

// lpFusedOff turns LogProbsFused off (RLPIPE_CUDA_LP_FUSED=0): it then
// refuses every call, and the model takes LogProbs.
var lpFusedOff = os.Getenv("RLPIPE_CUDA_LP_FUSED") == "0"

// LogProbsFused writes logp[i] = log_softmax(h·wᵀ/temperature)[i, targets[i]]
// as LogProbs does without entropy, but never holds the logits: each
// 128 × 256 tile of the product leaves, per row, its maximum and sum of
// exponentials (and the target's logit) in scratch, and a second kernel
// takes each row's log-sum-exp from them in float64. scratch is LogProbs'
// float32 workspace [C, V]; this op overwrites its first C·(2·⌈V/256⌉+1)
// values and leaves no logits there. h and w are both bf16 (or both f16)
// with H a multiple of 64, on Hopper; other operands give an error
// wrapping gpu.ErrNotFused, as does RLPIPE_CUDA_LP_FUSED=0. The values
// differ from LogProbs' in the products' accumulation order and the
// exponentials' rounding (float32 __expf, float32 sums within a tile). A
// target outside [0,V) yields NaN and an error at the next Sync.
func (b *Backend) LogProbsFused(logp, h, w, targets gpu.Tensor, temperature float32, scratch gpu.Tensor) error {
	const op = "logprobs fused"
	if lpFusedOff {
		return fmt.Errorf("%s: RLPIPE_CUDA_LP_FUSED=0: %w", op, gpu.ErrNotFused)
	}
	a, err := b.lpCheck(op, gpu.Tensor{}, h, w, targets, temperature, scratch)
	if err != nil {
		return err
	}
	if err := gpu.CheckLogProbs(op, logp, gpu.Tensor{}, h, w, targets, scratch, a.c, false); err != nil {
		return err
	}
	if !b.wgmma() {
		return fmt.Errorf("%s: needs Hopper's wgmma: %w", op, gpu.ErrNotFused)
	}
	dt := h.DType
	if (dt != gpu.BF16 && dt != gpu.F16) || w.DType != dt {
		return fmt.Errorf("%s: h is %v and w %v, want both bf16 or both f16: %w", op, h.DType, w.DType, gpu.ErrNotFused)
	}
	if a.hd%lhBK != 0 || a.h%16 != 0 || a.w%16 != 0 {
		return fmt.Errorf("%s: H %d not a multiple of %d, or h or w not 16-byte aligned: %w", op, a.hd, lhBK, gpu.ErrNotFused)
	}
	lpa, err := b.taddr(op, "logp", logp, gpu.F32)
	if err != nil {
		return err
	}
	if a.c == 0 {
		return nil
	}
	s, err := b.stream()
	if err != nil {
		return err
	}
	nn := (a.v + lhBN - 1) / lhBN
	// The partials (float2, 8-byte aligned: the workspace is float32 and
	// the arena aligns tensors to 256 bytes) and then the target logits.
	if a.logits%8 != 0 || 2*nn+1 > a.v {
		return fmt.Errorf("%s: the workspace is not 8-byte aligned or V %d too small for the partials: %w", op, a.v, gpu.ErrNotFused)
	}
	part := a.logits
	tz := part + uint64(a.c)*uint64(nn)*8
	ms, err := tensorMaps(b.d, tmapKey{a.h, a.c, 1, a.hd, lhBM}, tmapKey{a.w, a.v, 1, a.hd, lhBN})
	if err != nil {
		return err
	}
	nb := b.persistentGrid((a.c + lhBM - 1) / lhBM * nn)
	return b.issue(
		launch{name: kernel16("k_lp_head", dt), gx: nb, gy: 1, gz: 1, bx: lhThreads, by: 1, bz: 1, smem: lhSmem(),
			args: new(kargs).u64(part).u64(0).u64(tz).u64(0).u64(a.tg).u64(s.tileCounter()).put(ms[0][:]).put(ms[1][:]).
				i32(a.c).i32(a.v).i32(a.hd).f32(temperature)},
		b.lpCombine(a, nn, part, 0, tz, temperature, lpa, 0, 0))
}

// lpCombine is k_lp_combine's launch: the log-probs at lpa from the
// partials at part (and pt, with entropies at ea) and the target logits at
// tz; where sa is not 0, the rows' statistics there.
func (b *Backend) lpCombine(a lpArgs, nn int, part, pt, tz uint64, temperature float32, lpa, ea, sa uint64) launch {
	return launch{name: "k_lp_combine", gx: rowGrid((int64(a.c) + 7) / 8), gy: 1, gz: 1, bx: 256, by: 1, bz: 1,
		args: new(kargs).u64(part).u64(pt).u64(tz).u64(a.tg).i32(a.c).i32(nn).i32(a.v).f32(temperature).
			u64(lpa).u64(ea).u64(sa).u64(b.d.flag)}
}

// lpStoreOff turns lpHeadStore off (RLPIPE_CUDA_LP_STORE=0): LogProbs then
// always takes cuBLASLt's product and k_lp_fwd.
var lpStoreOff = os.Getenv("RLPIPE_CUDA_LP_STORE") == "0"

// lpHeadStore is LogProbs on Hopper as one persistent product whose
// epilogue stores the float32 logits to the workspace and leaves each 128
// × 256 tile's row maxima, sums of exponentials (and, with entropies, the
// sums of their products with z − max) in the cuBLASLt workspace, then
// k_lp_combine: the log-probs, the entropies and the statistics
// LogitsBackward takes, without reading the logits back. Rows whose
// partials do not fit the workspace at once go in blocks of equal size
// (lpStoreBlock), a product and its k_lp_combine each; a row's values do
// not depend on the blocks. It reports false, issuing nothing, where
// lpStoreTakes does not take the operands. The logits are those of the
// product in another accumulation order; the statistics are sums of
// float32 exponentials within a tile and float64 across tiles, within
// rounding of k_lp_fwd's, and LogitsBackward uses them as it uses
// k_lp_fwd's.
func (b *Backend) lpHeadStore(a lpArgs, hdt, wdt gpu.DType, temperature float32, entropyTempered bool, lpa, ea, sa uint64) (bool, error) {
	if ok, err := b.lpStoreTakes(a, hdt, wdt, temperature, entropyTempered); !ok || err != nil {
		return false, err
	}
	s, err := b.stream()
	if err != nil {
		return false, err
	}
	name := kernel16("k_lp_head_st", hdt)
	if a.hasEntropy {
		name = kernel16("k_lp_head_ste", hdt)
	}
	// A block's rows start at row r0: its h, targets, logits and outputs
	// are the views there, and its product reads h through its own map.
	esz := uint64(hdt.Size())
	rb := lpStoreBlock(a.c, a.v, a.hasEntropy)
	var blks []lpArgs
	keys := []tmapKey{{a.w, a.v, 1, a.hd, lhBN}}
	for r0 := 0; r0 < a.c; r0 += rb {
		blk, r := a, uint64(r0)
		blk.c = min(rb, a.c-r0)
		blk.h += r * uint64(a.hd) * esz
		blk.tg += r * 4
		blk.logits += r * uint64(a.v) * 4
		blks = append(blks, blk)
		keys = append(keys, tmapKey{blk.h, blk.c, 1, a.hd, lhBM})
	}
	ms, err := tensorMaps(b.d, keys...)
	if err != nil {
		return false, err
	}
	return true, b.d.do(func() error {
		// The workspace's address is the worker's to read: Release frees it.
		if b.d.released {
			return errReleased
		}
		ws := uint64(b.d.internal)
		var ls []launch
		for i, blk := range blks {
			r := uint64(i * rb)
			nn, pt, tz, _ := lpStoreLayout(blk.c, a.v, a.hasEntropy)
			if a.hasEntropy {
				pt += ws
			}
			nb := b.persistentGrid((blk.c + lhBM - 1) / lhBM * nn)
			ls = append(ls,
				launch{name: name, gx: nb, gy: 1, gz: 1, bx: lhThreads, by: 1, bz: 1, smem: lhSmem(),
					args: new(kargs).u64(ws).u64(pt).u64(ws + tz).u64(blk.logits).u64(blk.tg).u64(s.tileCounter()).put(ms[i+1][:]).put(ms[0][:]).
						i32(blk.c).i32(a.v).i32(a.hd).f32(temperature)},
				b.lpCombine(blk, nn, ws, pt, ws+tz, temperature, offsetIf(lpa, r*4), offsetIf(ea, r*4), offsetIf(sa, r*lpStatsRow)))
		}
		return b.d.run(s, ls...)
	})
}

// lpStatsRow is the bytes of a row of the statistics workspace.
const lpStatsRow = 4 * gpu.LogProbsStatsCols

// offsetIf returns a + off, or 0 where a is 0 (an output not asked for).
func offsetIf(a, off uint64) uint64 {
	if a == 0 {
		return 0
	}
	return a + off
}

// lpStoreRows, when positive, caps lpStoreBlock's blocks (tests: several
// blocks on small operands).
var lpStoreRows int

// lpStoreBlock returns the rows of lpHeadStore's blocks of c rows: the
// fewest blocks whose partials each fit the cuBLASLt workspace, of equal
// rows rounded up to the product's lhBM-row tiles (the last block takes
// what is left). It is 0 where not even lhBM rows fit.
func lpStoreBlock(c, v int, entropy bool) int {
	_, _, _, perRow := lpStoreLayout(1, v, entropy)
	most := int(workspaceBytes/perRow) / lhBM * lhBM
	if lpStoreRows > 0 {
		most = min(most, max(lpStoreRows/lhBM*lhBM, lhBM))
	}
	if most == 0 || c <= most {
		return min(c, most)
	}
	n := (c + most - 1) / most
	return ((c+n-1)/n + lhBM - 1) / lhBM * lhBM
}

// lpStoreTakes reports whether lpHeadStore takes the operands: 16-bit h
// and w of one dtype (16-byte aligned), H a multiple of 64, V even (the
// logits go out as float2s), an untempered entropy only at a temperature
// of 1 (the statistics of the raw logits are not kept), the backend's
// stream the one with the cuBLASLt workspace, and a vocabulary whose
// partials fit it for a block of 128 rows (lpStoreBlock); never with
// RLPIPE_CUDA_LP_STORE=0.
func (b *Backend) lpStoreTakes(a lpArgs, hdt, wdt gpu.DType, temperature float32, entropyTempered bool) (bool, error) {
	if lpStoreOff || !b.wgmma() || hdt != wdt || (hdt != gpu.BF16 && hdt != gpu.F16) {
		return false, nil
	}
	if a.hd%lhBK != 0 || a.h%16 != 0 || a.w%16 != 0 || a.v%2 != 0 || a.logits%8 != 0 {
		return false, nil
	}
	if a.hasEntropy && !entropyTempered && temperature != 1 {
		return false, nil
	}
	s, err := b.stream()
	if err != nil {
		return false, err
	}
	if !s.workspace || lpStoreBlock(a.c, a.v, a.hasEntropy) == 0 {
		return false, nil
	}
	return true, nil
}

// lpStoreLayout places lpHeadStore's partials, for nn tiles of lhBN
// columns a row, in the cuBLASLt workspace: float2 (max, sum) [c, nn] at
// 0, then with entropies float [c, nn] at pt, then the target logits
// float [c] at tz, ending at end (offsets in bytes).
func lpStoreLayout(c, v int, entropy bool) (nn int, pt, tz, end uint64) {
	nn = (v + lhBN - 1) / lhBN
	cc, n := uint64(c), uint64(nn)
	tz = cc * n * 8
	if entropy {
		pt, tz = tz, tz+cc*n*4
	}
	return nn, pt, tz, tz + cc*4
}

// lhSmem is k_lp_head_*'s dynamic shared memory: lhStages buffers of the
// rows' and the vocabulary's tiles, a "full" and an "empty" mbarrier per
// buffer, the tile queue, and 1 KB to align the tiles to 1024 bytes.
func lhSmem() int { return lhStages*(lhBM+lhBN)*lhBK*2 + 2*lhStages*8 + tileQueueBytes + 1024 }
