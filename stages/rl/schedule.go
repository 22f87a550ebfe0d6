package rl

import (
	"fmt"
	"math"
)

// Decay styles accepted by Schedule.Decay.
const (
	DecayConstant = "constant"
	DecayLinear   = "linear"
	DecayCosine   = "cosine"
)

// Schedule is the learning-rate schedule of the top-level train: section
// (keys lr, min_lr, warmup_init_lr, warmup_steps, decay_steps, decay). It
// follows Megatron's OptimizerParamScheduler as used by slime.
type Schedule struct {
	// LR is the peak learning rate.
	LR float64
	// MinLR is the floor reached at the end of linear or cosine decay.
	MinLR float64
	// WarmupInitLR is the learning rate of step 0 when WarmupSteps > 0.
	WarmupInitLR float64
	// WarmupSteps is the number of optimizer steps of linear warmup.
	WarmupSteps int
	// DecaySteps is the step, counted from 0 and including warmup, at
	// which linear or cosine decay reaches MinLR. Unused by constant.
	DecaySteps int
	// Decay is "constant" (also ""), "linear" or "cosine".
	Decay string
}

// Validate reports the first invalid field of s, naming its spec key.
func (s Schedule) Validate() error {
	if !finite(s.LR) || s.LR < 0 {
		return fmt.Errorf("lr: %v must be finite and >= 0", s.LR)
	}
	if !finite(s.MinLR) || s.MinLR < 0 || s.MinLR > s.LR {
		return fmt.Errorf("min_lr: %v must be in [0, lr]", s.MinLR)
	}
	if !finite(s.WarmupInitLR) || s.WarmupInitLR < 0 || s.WarmupInitLR > s.LR {
		return fmt.Errorf("warmup_init_lr: %v must be in [0, lr]", s.WarmupInitLR)
	}
	if s.WarmupSteps < 0 {
		return fmt.Errorf("warmup_steps: %d must be >= 0", s.WarmupSteps)
	}
	if s.DecaySteps < 0 {
		return fmt.Errorf("decay_steps: %d must be >= 0", s.DecaySteps)
	}
	switch s.Decay {
	case "", DecayConstant:
	case DecayLinear, DecayCosine:
		if s.DecaySteps <= s.WarmupSteps {
			return fmt.Errorf("decay_steps: %d must be > warmup_steps (%d) for %s decay", s.DecaySteps, s.WarmupSteps, s.Decay)
		}
	default:
		return fmt.Errorf("decay: unknown style %q (want constant, linear or cosine)", s.Decay)
	}
	return nil
}

// At returns the learning rate of optimizer step step, counted from 0: At(0)
// is used by the first optimizer step (slime's scheduler starts at 0 and is
// stepped after each optimizer step). Negative steps count as 0.
//
//   - step <= WarmupSteps (when WarmupSteps > 0):
//     WarmupInitLR + (LR − WarmupInitLR)·step/WarmupSteps;
//   - constant: LR;
//   - step > DecaySteps: MinLR;
//   - otherwise, with r = (step − WarmupSteps)/(DecaySteps − WarmupSteps):
//     MinLR + (LR − MinLR)·coeff, coeff = 1 − r (linear) or
//     0.5·(cos(π·r) + 1) (cosine).
//
// An invalid schedule (see Validate) gives LR after warmup instead of
// dividing by zero.
func (s Schedule) At(step int) float64 {
	step = max(step, 0)
	if s.WarmupSteps > 0 && step <= s.WarmupSteps {
		return s.WarmupInitLR + (s.LR-s.WarmupInitLR)*float64(step)/float64(s.WarmupSteps)
	}
	if s.Decay != DecayLinear && s.Decay != DecayCosine {
		return s.LR
	}
	if s.DecaySteps <= s.WarmupSteps {
		return s.LR
	}
	if step > s.DecaySteps {
		return s.MinLR
	}
	r := float64(step-s.WarmupSteps) / float64(s.DecaySteps-s.WarmupSteps)
	coeff := 1 - r
	if s.Decay == DecayCosine {
		coeff = 0.5 * (math.Cos(math.Pi*r) + 1)
	}
	return s.MinLR + coeff*(s.LR-s.MinLR)
}

// ClipCoef returns the factor that gradients are multiplied by when
// clipping to a global L2 norm of maxNorm, as torch.nn.utils.clip_grad_norm_
// does: min(maxNorm/(totalNorm + 1e-6), 1). maxNorm <= 0 means no clipping
// and returns 1. A NaN totalNorm gives NaN, as in torch (the caller should
// check the norm before stepping).
func ClipCoef(totalNorm, maxNorm float64) float64 {
	if maxNorm <= 0 {
		return 1
	}
	if math.IsNaN(totalNorm) {
		return math.NaN()
	}
	return math.Min(maxNorm/(totalNorm+1e-6), 1)
}
