package rollout

import "fmt"

// Groups returns the prompt groups of samples: one entry per distinct Group
// id, in order of the id's first appearance, each holding the indices into
// samples of that group's members in ascending order. The members of a group
// need not be consecutive. When n > 0 every group must have exactly n
// samples (samples_per_prompt); every group of the wrong size is reported.
func Groups(samples []Sample, n int) ([][]int, error) {
	if n < 0 {
		return nil, fmt.Errorf("samples per prompt must not be negative, got %d", n)
	}
	ids := make([]int, len(samples))
	for i := range samples {
		ids[i] = samples[i].Group
	}
	groups := members(ids)
	if n > 0 {
		var errs ErrorList
		for _, members := range groups {
			if len(members) != n {
				first := &samples[members[0]]
				errs = append(errs, &LineError{Line: first.Line,
					Msg: fmt.Sprintf("group %d (first sample %d) has %d samples, want samples_per_prompt %d", first.Group, first.Index, len(members), n)})
			}
		}
		if err := errs.err(); err != nil {
			return nil, err
		}
	}
	return groups, nil
}

// members groups the indices 0..len(ids)−1 by id: one entry per distinct
// id, in order of its first appearance, each holding its indices in
// ascending order.
func members(ids []int) [][]int {
	pos := map[int]int{}
	var groups [][]int
	for i, g := range ids {
		k, ok := pos[g]
		if !ok {
			k = len(groups)
			pos[g] = k
			groups = append(groups, nil)
		}
		groups[k] = append(groups[k], i)
	}
	return groups
}
