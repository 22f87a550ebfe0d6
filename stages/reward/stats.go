package reward

import (
	"fmt"
	"math"
)

// Stats summarises a step's rewards.
type Stats struct {
	// Mean is the mean reward.
	Mean float64
	// Std is the population standard deviation of the rewards (divided by
	// n, not n-1): the spread of this batch, as GRPO's group normalisation
	// computes it, and 0 for a single reward.
	Std float64
	// ZeroVarGroups is the fraction of prompt groups whose rewards are all
	// equal (a group of one sample included): GRPO's advantages are zero
	// there, so the policy learns nothing from them.
	ZeroVarGroups float64
}

// Summarize summarises rewards, given each sample's group id: groups[i] is
// the group of rewards[i]. A group is the set of samples that share an id,
// wherever they sit in the batch. Summarize of no rewards is the zero Stats.
// It panics when groups and rewards differ in length.
func Summarize(rewards []float64, groups []int) Stats {
	if len(groups) != len(rewards) {
		panic(fmt.Sprintf("reward: Summarize of %d rewards with %d group ids", len(rewards), len(groups)))
	}
	n := len(rewards)
	if n == 0 {
		return Stats{}
	}
	var sum float64
	for _, r := range rewards {
		sum += r
	}
	mean := sum / float64(n)
	var sq float64
	for _, r := range rewards {
		sq += (r - mean) * (r - mean)
	}

	first := make(map[int]float64) // each group's first reward
	varied := make(map[int]bool)   // groups with two different rewards
	for i, g := range groups {
		r0, seen := first[g]
		switch {
		case !seen:
			first[g] = rewards[i]
		case rewards[i] != r0:
			varied[g] = true
		}
	}
	return Stats{
		Mean:          mean,
		Std:           math.Sqrt(sq / float64(n)),
		ZeroVarGroups: float64(len(first)-len(varied)) / float64(len(first)),
	}
}
