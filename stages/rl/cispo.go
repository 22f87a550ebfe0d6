package rl

import "math"

// cispoTerm returns the CISPO policy term of one token (MiniMax-M1),
//
//	pg = −sg(min(ρ, hi))·a·l,
//
// its derivative with respect to the log-prob l (the ratio is detached, so
// it is −min(ρ, hi)·a and no token loses its gradient), and the clip
// indicator 1[ρ > hi].
func cispoTerm(rho, a, l, hi float64) (pg, dpg, clip float64) {
	w := math.Min(rho, hi)
	if rho > hi {
		clip = 1
	}
	return -w * a * l, -w * a, clip
}
