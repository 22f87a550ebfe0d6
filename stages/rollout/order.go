package rollout

import "math/bits"

// EpochOrder returns the order in which one PPO epoch visits the samples
// of a rollout batch, given each sample's prompt group id.
//
// Without shuffle it is rollout order, 0..len(groups)−1. With shuffle it is
// a permutation drawn from (seed, step, epoch) alone, so equal seeds give
// equal runs and a resumed run repeats the order of the uninterrupted one;
// with byGroup the prompt groups are permuted as wholes (in order of first
// appearance) and each group's samples keep their rollout order. The
// generator (SplitMix64) and the shuffle (Fisher–Yates with unbiased
// bounded draws) are written here, so the order does not change with the Go
// release.
func EpochOrder(groups []int, shuffle, byGroup bool, seed int64, step, epoch int) []int {
	n := len(groups)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	if !shuffle || n < 2 {
		return order
	}
	r := splitMix{state: uint64(seed)}
	r.state ^= r.next() ^ uint64(step)*0x9e3779b97f4a7c15
	r.state ^= r.next() ^ uint64(epoch)*0xbf58476d1ce4e5b9
	if !byGroup {
		r.shuffle(order)
		return order
	}
	whole := members(groups)
	perm := make([]int, len(whole))
	for i := range perm {
		perm[i] = i
	}
	r.shuffle(perm)
	order = order[:0]
	for _, k := range perm {
		order = append(order, whole[k]...)
	}
	return order
}

// splitMix is the SplitMix64 generator.
type splitMix struct{ state uint64 }

func (r *splitMix) next() uint64 {
	r.state += 0x9e3779b97f4a7c15
	z := r.state
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// below returns a uniform integer in [0, n), n > 0, by Lemire's
// multiply-and-reject method.
func (r *splitMix) below(n uint64) uint64 {
	hi, lo := bits.Mul64(r.next(), n)
	if lo < n {
		threshold := -n % n
		for lo < threshold {
			hi, lo = bits.Mul64(r.next(), n)
		}
	}
	return hi
}

// shuffle permutes s in place (Fisher–Yates).
func (r *splitMix) shuffle(s []int) {
	for i := len(s) - 1; i > 0; i-- {
		j := int(r.below(uint64(i + 1)))
		s[i], s[j] = s[j], s[i]
	}
}

// Rand is a deterministic random source for one purpose of a run, seeded
// by the run's seed and keys naming the draw (a step, a sample, a
// position): equal seeds and keys give equal draws on every machine and Go
// release.
type Rand struct{ sm splitMix }

// NewRand returns the source of seed and keys.
func NewRand(seed int64, keys ...uint64) *Rand {
	r := &Rand{splitMix{state: uint64(seed)}}
	for _, k := range keys {
		r.sm.state ^= r.sm.next() ^ k*0x9e3779b97f4a7c15
	}
	return r
}

// Float64 returns a uniform draw in [0, 1), with 53 random bits.
func (r *Rand) Float64() float64 { return float64(r.sm.next()>>11) / (1 << 53) }
