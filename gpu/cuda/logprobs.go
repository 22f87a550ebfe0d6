//go:build cgo

package cuda

import (
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
)

// lpArgs are the checked operands of LogProbs and LogProbsBackward.
type lpArgs struct {
	c, hd, v         int
	h, w, tg, logits uint64
	hasEntropy       bool
}

func (b *Backend) lpCheck(op string, entropy, h, w, targets gpu.Tensor, temperature float32, logits gpu.Tensor) (lpArgs, error) {
	var a lpArgs
	var err error
	if a.c, a.hd, a.v, a.hasEntropy, err = gpu.LogProbsDims(op, entropy, h, w, targets, temperature, logits); err != nil {
		return a, err
	}
	if a.h, err = b.faddr(op, "h", h); err != nil {
		return a, err
	}
	if a.w, err = b.faddr(op, "w", w); err != nil {
		return a, err
	}
	if a.logits, err = b.taddr(op, "logits", logits, gpu.F32); err != nil {
		return a, err
	}
	if a.tg, err = b.taddr(op, "targets", targets, gpu.I32); err != nil {
		return a, err
	}
	return a, nil
}

// LogProbs computes logits = h@wᵀ into the F32 workspace with cuBLASLt
// (float32 accumulation; float32 output), then one block per row computes
// the log-softmax of the tempered logits at the target and the entropy
// (float32 exponentials summed in float64; see kernels/logprobs.cu). A
// target outside [0,V) yields NaN and an error at the next Sync. Unless
// stats is empty, each row's statistics (three float64s and a tag of the
// temperature and what they hold) go there too, for LogitsBackward. On
// Hopper, where lpHeadStore takes the operands, the product, the logits'
// store and the statistics are one kernel instead (kernels/lphead.cu).
func (b *Backend) LogProbs(logp, entropy, h, w, targets gpu.Tensor, temperature float32, entropyTempered bool, logits, stats gpu.Tensor) error {
	const op = "logprobs"
	a, err := b.lpCheck(op, entropy, h, w, targets, temperature, logits)
	if err != nil {
		return err
	}
	if err := gpu.CheckLogProbs(op, logp, entropy, h, w, targets, logits, a.c, a.hasEntropy); err != nil {
		return err
	}
	lpa, err := b.taddr(op, "logp", logp, gpu.F32)
	if err != nil {
		return err
	}
	var ea uint64
	if a.hasEntropy {
		if ea, err = b.taddr(op, "entropy", entropy, gpu.F32); err != nil {
			return err
		}
	}
	sa, err := b.lpStats(op, stats, a.c, gpu.Arg("logp", logp), gpu.Arg("entropy", entropy), gpu.Arg("h", h),
		gpu.Arg("w", w), gpu.Arg("targets", targets), gpu.Arg("logits", logits))
	if err != nil {
		return err
	}
	if a.c == 0 {
		return nil
	}
	if done, err := b.lpHeadStore(a, h.DType, w.DType, temperature, entropyTempered, lpa, ea, sa); done || err != nil {
		return err
	}
	if err := b.matmul(mat{a.logits, gpu.F32, a.c, a.v, int64(a.v)}, mat{a.h, h.DType, a.c, a.hd, int64(a.hd)},
		mat{a.w, w.DType, a.v, a.hd, int64(a.hd)}, false, true, 1, 0); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return b.lpRows(a, temperature, entropyTempered, lpa, ea, sa)
}

// lpBlock is the block of k_lp_fwd, k_lp_bwd and k_lp_bwd8: one a row. The
// forward and the backward must share it, as a row's statistics are summed
// over the block's threads: the backward's equal the forward's saved ones
// only so.
const lpBlock = 512

// lpStats checks the statistics workspace and returns its address (0 when
// it is absent).
func (b *Backend) lpStats(op string, stats gpu.Tensor, c int, others ...gpu.Named) (uint64, error) {
	if err := gpu.CheckLogProbsStats(op, stats, c, others...); err != nil || stats.Mem == nil {
		return 0, err
	}
	a, err := b.taddr(op, "stats", stats, gpu.F32)
	if err != nil {
		return 0, err
	}
	// The kernels keep float64s there.
	if a%8 != 0 {
		return 0, fmt.Errorf("%s: stats at %#x is not 8-byte aligned", op, a)
	}
	return a, nil
}

// lpRows issues k_lp_fwd on the logits in a's workspace: the log-probs at
// lpa and, where ea is not 0, the entropies there; where sa is not 0, the
// rows' statistics there.
func (b *Backend) lpRows(a lpArgs, temperature float32, entropyTempered bool, lpa, ea, sa uint64) error {
	return b.issue(launch{name: "k_lp_fwd", gx: rowGrid(int64(a.c)), gy: 1, gz: 1, bx: lpBlock, by: 1, bz: 1,
		args: new(kargs).u64(a.logits).i64(int64(a.c)).i64(int64(a.v)).u64(a.tg).f32(temperature).i32(b2i(entropyTempered)).
			u64(lpa).u64(ea).u64(sa).u64(b.d.flag)})
}

// LogProbsBackward recomputes the logits, turns them into dlogits in place
// (per-row statistics as in LogProbs; 16-byte accesses when V is a multiple
// of 8) and computes dh = dlogits@w and dw += dlogitsᵀ@h. When h and w
// share a 16-bit dtype, the dlogits are rounded to it (packed at the start
// of each float32 row of the workspace, leading dimension 2V) so that both
// products run on cuBLASLt's tensor-core path, as under autocast; the extra
// rounding is 2^-9 relative per element (bf16). Otherwise they stay float32
// and products with mixed dtypes use the SIMT kernel.
func (b *Backend) LogProbsBackward(dh, dw, dlogp, dentropy, h, w, targets gpu.Tensor, temperature float32, entropyTempered bool, logits gpu.Tensor) error {
	return b.lpBackward("logprobs backward", true, dh, dw, dlogp, dentropy, h, w, targets, temperature, entropyTempered, logits, gpu.Tensor{})
}

// LogitsBackward is LogProbsBackward on the logits LogProbs left in the
// workspace: it skips their recomputation. With the statistics LogProbs
// left in stats it also skips their second reading: a row takes them
// where their tag matches this call's temperature and entropy, else it
// computes them as without stats. k_lp_fwd's statistics are the bits
// k_lp_bwd8 would compute, in the same block; lpHeadStore's are within
// their rounding (sums within a tile in float32), and the backward then
// takes the log-sum-exp the forward's log-probs were taken with.
func (b *Backend) LogitsBackward(dh, dw, dlogp, dentropy, h, w, targets gpu.Tensor, temperature float32, entropyTempered bool, logits, stats gpu.Tensor) error {
	return b.lpBackward("logits backward", false, dh, dw, dlogp, dentropy, h, w, targets, temperature, entropyTempered, logits, stats)
}

// lpBackward is LogProbsBackward (recompute true) or LogitsBackward.
func (b *Backend) lpBackward(op string, recompute bool, dh, dw, dlogp, dentropy, h, w, targets gpu.Tensor, temperature float32, entropyTempered bool, logits, stats gpu.Tensor) error {
	a, err := b.lpCheck(op, dentropy, h, w, targets, temperature, logits)
	if err != nil {
		return err
	}
	if err := gpu.CheckLogProbsBackward(op, dh, dw, dlogp, dentropy, h, w, targets, logits, a.c, a.hd, a.v); err != nil {
		return err
	}
	withDW := dw.Mem != nil
	ga, err := b.taddr(op, "dlogp", dlogp, gpu.F32)
	if err != nil {
		return err
	}
	var gea uint64
	if a.hasEntropy {
		if gea, err = b.taddr(op, "dentropy", dentropy, gpu.F32); err != nil {
			return err
		}
	}
	dha, err := b.faddr(op, "dh", dh)
	if err != nil {
		return err
	}
	var dwa uint64
	if withDW {
		if dwa, err = b.faddr(op, "dw", dw); err != nil {
			return err
		}
	}
	sa, err := b.lpStats(op, stats, a.c, gpu.Arg("dh", dh), gpu.Arg("dw", dw), gpu.Arg("dlogp", dlogp),
		gpu.Arg("dentropy", dentropy), gpu.Arg("h", h), gpu.Arg("w", w), gpu.Arg("targets", targets), gpu.Arg("logits", logits))
	if err != nil {
		return err
	}
	if a.c == 0 {
		return nil
	}
	if recompute {
		if err := b.matmul(mat{a.logits, gpu.F32, a.c, a.v, int64(a.v)}, mat{a.h, h.DType, a.c, a.hd, int64(a.hd)},
			mat{a.w, w.DType, a.v, a.hd, int64(a.hd)}, false, true, 1, 0); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	dl := mat{a.logits, gpu.F32, a.c, a.v, int64(a.v)}
	if h.DType == w.DType && h.DType != gpu.F32 {
		dl.dt, dl.ld = w.DType, 2*int64(a.v)
	}
	kernel := "k_lp_bwd"
	if a.v%8 == 0 && a.logits%16 == 0 {
		kernel = "k_lp_bwd8"
	}
	if err := b.issue(launch{name: kernel, gx: rowGrid(int64(a.c)), gy: 1, gz: 1, bx: lpBlock, by: 1, bz: 1,
		args: new(kargs).u64(a.logits).i64(int64(a.c)).i64(int64(a.v)).u64(a.tg).f32(temperature).i32(b2i(entropyTempered)).
			u64(ga).u64(gea).dt(dl.dt).u64(sa).u64(b.d.flag)}); err != nil {
		return err
	}
	if err := b.matmul(mat{dha, dh.DType, a.c, a.hd, int64(a.hd)}, dl, mat{a.w, w.DType, a.v, a.hd, int64(a.hd)}, false, false, 1, 0); err != nil {
		return fmt.Errorf("%s: dh: %w", op, err)
	}
	if withDW {
		if err := b.matmul(mat{dwa, dw.DType, a.v, a.hd, int64(a.hd)}, dl, mat{a.h, h.DType, a.c, a.hd, int64(a.hd)}, true, false, 1, 1); err != nil {
			return fmt.Errorf("%s: dw: %w", op, err)
		}
	}
	return nil
}
