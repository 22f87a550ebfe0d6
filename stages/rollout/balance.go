package rollout

import (
	"container/heap"
	"fmt"
	"slices"
)

// kkSet is one subset of a Karmarkar–Karp partial partition.
type kkSet struct {
	sum int
	min int // smallest index in idx; meaningless when idx is empty
	idx []int
}

// kkState is a partial partition into k subsets, kept sorted by decreasing
// sum (see order).
type kkState struct {
	sets   []kkSet
	spread int // largest sum − smallest sum
	id     int // creation order, the heap's tie-break
}

// order sorts the subsets by decreasing sum, then decreasing size, then
// increasing smallest index. Putting empty subsets after non-empty subsets
// of equal sum keeps every subset non-empty whenever there are at least k
// items of non-negative length.
func (st *kkState) order() {
	slices.SortFunc(st.sets, func(a, b kkSet) int {
		switch {
		case a.sum != b.sum:
			return b.sum - a.sum
		case len(a.idx) != len(b.idx):
			return len(b.idx) - len(a.idx)
		case len(a.idx) == 0:
			return 0
		}
		return a.min - b.min
	})
	st.spread = st.sets[0].sum - st.sets[len(st.sets)-1].sum
}

// kkHeap is a max-heap of partial partitions by spread.
type kkHeap []*kkState

func (h kkHeap) Len() int { return len(h) }
func (h kkHeap) Less(i, j int) bool {
	if h[i].spread != h[j].spread {
		return h[i].spread > h[j].spread
	}
	return h[i].id < h[j].id
}
func (h kkHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *kkHeap) Push(x any)   { *h = append(*h, x.(*kkState)) }
func (h *kkHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Balance partitions the indices 0..len(lengths)-1 into parts subsets with
// sums of lengths as equal as possible, using the Karmarkar–Karp largest
// differencing method generalised to k-way partitioning: every item starts as
// a partial partition of its own; the two partial partitions of largest
// spread are repeatedly merged, pairing the largest subset of one with the
// smallest of the other, until one remains.
//
// The result has exactly parts entries (nil when parts < 1). Each holds its
// indices in ascending order; parts are ordered by their smallest index, and
// empty parts (only when len(lengths) < parts) come last. The result depends
// only on the inputs. Lengths are expected to be non-negative.
func Balance(lengths []int, parts int) [][]int {
	if parts < 1 {
		return nil
	}
	out := make([][]int, parts)
	if len(lengths) == 0 {
		return out
	}
	h := make(kkHeap, 0, len(lengths))
	for i, l := range lengths {
		st := &kkState{sets: make([]kkSet, parts), id: i}
		st.sets[0] = kkSet{sum: l, min: i, idx: []int{i}}
		st.order()
		h = append(h, st)
	}
	heap.Init(&h)
	next := len(lengths)
	for h.Len() > 1 {
		a := heap.Pop(&h).(*kkState)
		b := heap.Pop(&h).(*kkState)
		for i := range a.sets {
			s, t := &a.sets[i], b.sets[parts-1-i]
			if len(t.idx) > 0 && (len(s.idx) == 0 || t.min < s.min) {
				s.min = t.min
			}
			s.sum += t.sum
			s.idx = append(s.idx, t.idx...)
		}
		a.id = next
		next++
		a.order()
		heap.Push(&h, a)
	}
	for i, s := range h[0].sets {
		out[i] = slices.Clone(s.idx)
		slices.Sort(out[i])
	}
	slices.SortStableFunc(out, func(a, b []int) int {
		switch {
		case len(a) == 0 && len(b) == 0:
			return 0
		case len(a) == 0:
			return 1
		case len(b) == 0:
			return -1
		}
		return a[0] - b[0]
	})
	return out
}

// MicroBatches splits the samples idx (indices into lengths) into
// micro-batches of at most maxTokens tokens each, by first-fit decreasing:
// samples are taken longest first (ties by index) and each goes into the
// first micro-batch with room, or opens a new one. Micro-batches are returned
// in the order they were opened, each with its indices ascending. A sample
// longer than maxTokens, a negative length, an index out of range or listed
// twice is an error naming the sample. An empty idx gives no micro-batches.
func MicroBatches(lengths []int, idx []int, maxTokens int) ([][]int, error) {
	if maxTokens <= 0 {
		return nil, fmt.Errorf("max tokens per micro-batch must be positive, got %d", maxTokens)
	}
	var errs ErrorList
	seen := map[int]bool{}
	for _, i := range idx {
		switch {
		case i < 0 || i >= len(lengths):
			errs = append(errs, &LineError{Msg: fmt.Sprintf("sample %d is out of range (%d samples)", i, len(lengths))})
		case seen[i]:
			errs = append(errs, &LineError{Msg: fmt.Sprintf("sample %d is listed twice", i)})
		case lengths[i] < 0:
			errs = append(errs, &LineError{Msg: fmt.Sprintf("sample %d has negative length %d", i, lengths[i])})
		case lengths[i] > maxTokens:
			errs = append(errs, &LineError{Msg: fmt.Sprintf("sample %d has %d tokens, more than the %d allowed per micro-batch (max_tokens_per_gpu)", i, lengths[i], maxTokens)})
		}
		seen[i] = true
	}
	if err := errs.err(); err != nil {
		return nil, err
	}
	order := slices.Clone(idx)
	slices.SortFunc(order, func(a, b int) int {
		if lengths[a] != lengths[b] {
			return lengths[b] - lengths[a]
		}
		return a - b
	})
	var bins [][]int
	var sums []int
	for _, i := range order {
		placed := false
		for b := range bins {
			if sums[b]+lengths[i] <= maxTokens {
				bins[b] = append(bins[b], i)
				sums[b] += lengths[i]
				placed = true
				break
			}
		}
		if !placed {
			bins = append(bins, []int{i})
			sums = append(sums, lengths[i])
		}
	}
	for _, b := range bins {
		slices.Sort(b)
	}
	return bins, nil
}

// Steps splits n samples, in order, into optimizer steps of globalBatch
// samples each (global_batch_size, counted over all dp ranks). n must be a
// positive multiple of globalBatch: a remainder is an error rather than a
// silently dropped or short step.
func Steps(n, globalBatch int) ([][]int, error) {
	switch {
	case globalBatch <= 0:
		return nil, fmt.Errorf("global batch size must be positive, got %d", globalBatch)
	case n <= 0:
		return nil, fmt.Errorf("no samples to split into steps (n = %d)", n)
	case n%globalBatch != 0:
		return nil, fmt.Errorf("%d samples is not a multiple of global_batch_size %d (%d left over)", n, globalBatch, n%globalBatch)
	}
	steps := make([][]int, n/globalBatch)
	for s := range steps {
		steps[s] = make([]int, globalBatch)
		for j := range steps[s] {
			steps[s][j] = s*globalBatch + j
		}
	}
	return steps, nil
}

// Plan lays out one optimizer step: the samples step (indices into lengths)
// are balanced by token count over ranks dp ranks (Balance), then each rank's
// share is cut into micro-batches of at most maxTokens tokens. Every rank gets
// the same number of micro-batches M, the largest first-fit-decreasing count
// of any rank, because FSDP ranks must run the same number of forward and
// backward passes. A rank needing fewer is re-split into M token-balanced
// micro-batches when that respects maxTokens, and otherwise keeps its
// first-fit-decreasing micro-batches followed by empty ones. An empty
// micro-batch (possible only when a rank has fewer than M samples) holds no
// samples; the runtime must still run its collectives.
//
// The result is indexed [rank][micro-batch] and holds indices into lengths,
// ascending within each micro-batch.
func Plan(lengths []int, step []int, ranks, maxTokens int) ([][][]int, error) {
	if ranks < 1 {
		return nil, fmt.Errorf("dp ranks must be positive, got %d", ranks)
	}
	seen := make(map[int]bool, len(step))
	for _, i := range step {
		switch {
		case i < 0 || i >= len(lengths):
			return nil, fmt.Errorf("sample %d is out of range (%d samples)", i, len(lengths))
		case seen[i]:
			return nil, fmt.Errorf("sample %d is listed twice", i)
		}
		seen[i] = true
	}
	stepLens := make([]int, len(step))
	for j, i := range step {
		stepLens[j] = lengths[i]
	}
	parts := Balance(stepLens, ranks)
	shares := make([][]int, ranks)
	mbs := make([][][]int, ranks)
	m := 0
	for r, p := range parts {
		shares[r] = make([]int, len(p))
		for j, k := range p {
			shares[r][j] = step[k]
		}
		slices.Sort(shares[r])
		var err error
		if mbs[r], err = MicroBatches(lengths, shares[r], maxTokens); err != nil {
			return nil, fmt.Errorf("rank %d: %w", r, err)
		}
		m = max(m, len(mbs[r]))
	}
	for r := range mbs {
		if len(mbs[r]) == m {
			continue
		}
		shareLens := make([]int, len(shares[r]))
		for j, i := range shares[r] {
			shareLens[j] = lengths[i]
		}
		split := Balance(shareLens, m)
		fits := true
		for b, part := range split {
			sum := 0
			for j, k := range part {
				part[j] = shares[r][k]
				sum += lengths[part[j]]
			}
			slices.Sort(part)
			if part == nil {
				split[b] = []int{}
			}
			fits = fits && sum <= maxTokens
		}
		if fits {
			mbs[r] = split
			continue
		}
		for len(mbs[r]) < m {
			mbs[r] = append(mbs[r], []int{})
		}
	}
	return mbs, nil
}
