package rollout

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
)

func TestEpochOrder(t *testing.T) {
	groups := []int{0, 0, 1, 1, 2, 2, 3, 3}
	tests := []struct {
		name             string
		shuffle, byGroup bool
		want             []int
	}{
		{"rollout order", false, false, []int{0, 1, 2, 3, 4, 5, 6, 7}},
		{"rollout order ignores byGroup", false, true, []int{0, 1, 2, 3, 4, 5, 6, 7}},
		// Pinned, so that a change of the generator or the shuffle, which
		// would change every seeded run, fails here.
		{"shuffled", true, false, []int{5, 4, 7, 0, 1, 6, 3, 2}},
		{"shuffled by group", true, true, []int{0, 1, 4, 5, 6, 7, 2, 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := EpochOrder(groups, tt.shuffle, tt.byGroup, 1, 3, 2)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("order %v, want %v", got, tt.want)
			}
		})
	}
}

func TestEpochOrderProperties(t *testing.T) {
	const n = 64
	groups := make([]int, n)
	for i := range groups {
		groups[i] = (i * 7) % 16 // 16 groups of 4, interleaved
	}
	base := EpochOrder(groups, true, false, 5, 1, 1)
	if !reflect.DeepEqual(EpochOrder(groups, true, false, 5, 1, 1), base) {
		t.Error("the same seed, step and epoch give another order")
	}
	sorted := slices.Clone(base)
	slices.Sort(sorted)
	for i, v := range sorted {
		if v != i {
			t.Fatalf("order %v is not a permutation of 0..%d", base, n-1)
		}
	}
	for _, other := range [][3]int{{6, 1, 1}, {5, 2, 1}, {5, 1, 2}} {
		if reflect.DeepEqual(EpochOrder(groups, true, false, int64(other[0]), other[1], other[2]), base) {
			t.Errorf("seed/step/epoch %v give the same order as 5/1/1", other)
		}
	}
	g := EpochOrder(groups, true, true, 5, 1, 1)
	for i := 0; i < n; i += 4 {
		for j := i + 1; j < i+4; j++ {
			if groups[g[j]] != groups[g[i]] || g[j] < g[j-1] {
				t.Fatalf("by-group order %v splits or reorders group %d", g, groups[g[i]])
			}
		}
	}
}

// TestEpochOrderUniform draws the 6 orders of 3 samples 60000 times over
// seeds: each must come up about 10000 times (a biased shuffle does not).
func TestEpochOrderUniform(t *testing.T) {
	count := map[string]int{}
	for seed := range int64(60000) {
		count[fmt.Sprint(EpochOrder([]int{0, 1, 2}, true, false, seed, 1, 1))]++
	}
	if len(count) != 6 {
		t.Fatalf("%d distinct orders of 3, want 6: %v", len(count), count)
	}
	for k, c := range count {
		if c < 9400 || c > 10600 {
			t.Errorf("order %s drawn %d times of 60000, want about 10000", k, c)
		}
	}
}
