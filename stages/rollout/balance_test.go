package rollout

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// greedy is the longest-processing-time heuristic: items by decreasing
// length, each into the currently lightest part.
func greedy(lengths []int, parts int) [][]int {
	order := make([]int, len(lengths))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return lengths[b] - lengths[a] })
	out := make([][]int, parts)
	sums := make([]int, parts)
	for _, i := range order {
		k := 0
		for j := range sums {
			if sums[j] < sums[k] {
				k = j
			}
		}
		out[k] = append(out[k], i)
		sums[k] += lengths[i]
	}
	return out
}

func sums(lengths []int, parts [][]int) []int {
	out := make([]int, len(parts))
	for p, idx := range parts {
		for _, i := range idx {
			out[p] += lengths[i]
		}
	}
	return out
}

// checkPartition fails unless parts holds every index of 0..n-1 exactly once,
// each part ascending.
func checkPartition(t *testing.T, n int, parts [][]int) {
	t.Helper()
	seen := make([]int, n)
	for _, p := range parts {
		if !slices.IsSorted(p) {
			t.Errorf("part %v is not ascending", p)
		}
		for _, i := range p {
			if i < 0 || i >= n {
				t.Fatalf("index %d out of range", i)
			}
			seen[i]++
		}
	}
	for i, c := range seen {
		if c != 1 {
			t.Errorf("index %d appears %d times", i, c)
		}
	}
}

func TestBalanceKnownCases(t *testing.T) {
	tests := []struct {
		name    string
		lengths []int
		parts   int
		wantMax int // the largest part sum Karmarkar–Karp reaches
	}{
		{"classic 2-way", []int{8, 7, 6, 5, 4}, 2, 16}, // greedy: 17, optimum 15
		{"3-way", []int{8, 7, 6, 5, 4}, 3, 11},
		{"perfect 2-way", []int{4, 5, 6, 7, 8, 10}, 2, 20},
		{"equal items", []int{3, 3, 3, 3, 3, 3}, 3, 6},
		{"one giant", []int{100, 1, 1, 1}, 2, 100},
		{"more parts than items", []int{5, 2}, 4, 5},
		{"single part", []int{1, 2, 3}, 1, 6},
		{"zeros", []int{0, 0, 0, 0}, 2, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Balance(tc.lengths, tc.parts)
			if len(got) != tc.parts {
				t.Fatalf("got %d parts, want %d", len(got), tc.parts)
			}
			checkPartition(t, len(tc.lengths), got)
			kk := slices.Max(sums(tc.lengths, got))
			gr := slices.Max(sums(tc.lengths, greedy(tc.lengths, tc.parts)))
			if kk != tc.wantMax {
				t.Errorf("max part sum %d, want %d (parts %v)", kk, tc.wantMax, got)
			}
			if kk > gr {
				t.Errorf("Karmarkar–Karp max %d is worse than greedy %d", kk, gr)
			}
			if len(tc.lengths) >= tc.parts {
				for _, p := range got {
					if len(p) == 0 {
						t.Errorf("empty part with %d items for %d parts: %v", len(tc.lengths), tc.parts, got)
					}
				}
			}
			if !reflect.DeepEqual(got, Balance(tc.lengths, tc.parts)) {
				t.Error("Balance is not deterministic")
			}
		})
	}
}

func TestBalanceEdgeCases(t *testing.T) {
	if got := Balance([]int{1}, 0); got != nil {
		t.Errorf("parts 0: got %v, want nil", got)
	}
	if got := Balance(nil, 3); len(got) != 3 || got[0] != nil {
		t.Errorf("no items: got %v, want 3 empty parts", got)
	}
	got := Balance([]int{5, 2}, 4)
	if want := [][]int{{0}, {1}, nil, nil}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestBalanceRandomProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	worse := 0
	for trial := range 200 {
		n := 1 + rng.IntN(300)
		parts := 1 + rng.IntN(16)
		lengths := make([]int, n)
		for i := range lengths {
			lengths[i] = 1 + rng.IntN(4096)
		}
		got := Balance(lengths, parts)
		checkPartition(t, n, got)
		s := sums(lengths, got)
		kk := slices.Max(s)
		if kk > slices.Max(sums(lengths, greedy(lengths, parts))) {
			worse++
		}
		if n >= parts && slices.Min(s) == 0 {
			t.Errorf("trial %d: empty part with %d items for %d parts", trial, n, parts)
		}
		// The spread never exceeds the longest item.
		if kk-slices.Min(s) > slices.Max(lengths) {
			t.Errorf("trial %d: spread %d exceeds the longest item %d", trial, kk-slices.Min(s), slices.Max(lengths))
		}
	}
	if worse > 10 {
		t.Errorf("Karmarkar–Karp worse than greedy in %d of 200 trials", worse)
	}
}

func TestMicroBatches(t *testing.T) {
	lengths := []int{5, 9, 3, 4, 1, 10, 2, 8}
	tests := []struct {
		name    string
		idx     []int
		max     int
		want    [][]int
		wantErr string
	}{
		{"ffd", []int{0, 1, 2, 3, 4, 6, 7}, 10, [][]int{{1, 4}, {6, 7}, {0, 3}, {2}}, ""},
		{"subset", []int{7, 2, 0}, 11, [][]int{{2, 7}, {0}}, ""},
		{"all fit", []int{0, 2}, 100, [][]int{{0, 2}}, ""},
		{"exact fit", []int{5}, 10, [][]int{{5}}, ""},
		{"empty", nil, 10, nil, ""},
		{"too long", []int{0, 5, 1}, 9, nil, "sample 5 has 10 tokens, more than the 9 allowed per micro-batch (max_tokens_per_gpu)"},
		{"out of range", []int{8}, 9, nil, "sample 8 is out of range (8 samples)"},
		{"twice", []int{2, 2}, 9, nil, "sample 2 is listed twice"},
		{"bad max", []int{1}, 0, nil, "max tokens per micro-batch must be positive, got 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := MicroBatches(lengths, tc.idx, tc.max)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestMicroBatchesRandomProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100 {
		n := 1 + rng.IntN(200)
		lengths := make([]int, n)
		total := 0
		for i := range lengths {
			lengths[i] = 1 + rng.IntN(2000)
			total += lengths[i]
		}
		idx := rng.Perm(n)[:1+rng.IntN(n)]
		maxTokens := 2000 + rng.IntN(6000)
		got, err := MicroBatches(lengths, idx, maxTokens)
		if err != nil {
			t.Fatal(err)
		}
		count := 0
		for _, s := range sums(lengths, got) {
			if s > maxTokens {
				t.Errorf("micro-batch of %d tokens exceeds %d", s, maxTokens)
			}
		}
		for _, mb := range got {
			count += len(mb)
			if !slices.IsSorted(mb) {
				t.Errorf("micro-batch %v not ascending", mb)
			}
		}
		if count != len(idx) {
			t.Errorf("%d samples in micro-batches, want %d", count, len(idx))
		}
		// First fit never leaves two micro-batches that could be merged.
		s := sums(lengths, got)
		slices.Sort(s)
		if len(s) >= 2 && s[0]+s[1] <= maxTokens {
			t.Errorf("two micro-batches of %d and %d tokens fit in one of %d", s[0], s[1], maxTokens)
		}
	}
}

func TestSteps(t *testing.T) {
	got, err := Steps(6, 3)
	if err != nil || !reflect.DeepEqual(got, [][]int{{0, 1, 2}, {3, 4, 5}}) {
		t.Errorf("Steps(6, 3) = %v, %v", got, err)
	}
	for _, tc := range []struct {
		n, gb int
		want  string
	}{
		{7, 3, "7 samples is not a multiple of global_batch_size 3 (1 left over)"},
		{6, 0, "global batch size must be positive, got 0"},
		{0, 4, "no samples to split into steps (n = 0)"},
	} {
		if _, err := Steps(tc.n, tc.gb); err == nil || err.Error() != tc.want {
			t.Errorf("Steps(%d, %d) error %v, want %q", tc.n, tc.gb, err, tc.want)
		}
	}
}

func TestPlan(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	lengths := make([]int, 64)
	for i := range lengths {
		lengths[i] = 100 + rng.IntN(900)
	}
	step := make([]int, 32)
	for i := range step {
		step[i] = 32 + i // the second step of two
	}
	const ranks, maxTokens = 4, 2500
	plan, err := Plan(lengths, step, ranks, maxTokens)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan) != ranks {
		t.Fatalf("%d ranks, want %d", len(plan), ranks)
	}
	seen := map[int]int{}
	for r, mbs := range plan {
		if len(mbs) != len(plan[0]) {
			t.Errorf("rank %d has %d micro-batches, rank 0 has %d", r, len(mbs), len(plan[0]))
		}
		for _, mb := range mbs {
			if s := sums(lengths, [][]int{mb})[0]; s > maxTokens {
				t.Errorf("rank %d micro-batch %v has %d tokens", r, mb, s)
			}
			if !slices.IsSorted(mb) {
				t.Errorf("micro-batch %v not ascending", mb)
			}
			for _, i := range mb {
				seen[i]++
			}
		}
	}
	for _, i := range step {
		if seen[i] != 1 {
			t.Errorf("sample %d planned %d times", i, seen[i])
		}
	}
	if len(seen) != len(step) {
		t.Errorf("%d samples planned, want %d", len(seen), len(step))
	}

	// A rank with fewer samples than the others' micro-batch count gets
	// empty micro-batches.
	plan, err = Plan([]int{10, 10, 10, 30}, []int{0, 1, 2, 3}, 2, 10)
	if err == nil {
		t.Fatalf("sample longer than maxTokens accepted: %v", plan)
	}
	plan, err = Plan([]int{10, 10, 10, 30}, []int{0, 1, 2, 3}, 2, 30)
	if err != nil {
		t.Fatal(err)
	}
	if want := [][][]int{{{0, 1, 2}}, {{3}}}; !reflect.DeepEqual(plan, want) {
		t.Errorf("got %v, want %v", plan, want)
	}
	plan, err = Plan([]int{10, 10, 10, 10, 40}, []int{0, 1, 2, 3, 4}, 2, 20)
	if err == nil || !strings.Contains(err.Error(), "sample 4 has 40 tokens") {
		t.Fatalf("got %v, %v", plan, err)
	}
	plan, err = Plan([]int{10, 6, 6}, []int{0, 1, 2}, 2, 10)
	if err != nil {
		t.Fatal(err)
	}
	if want := [][][]int{{{0}, {}}, {{1}, {2}}}; !reflect.DeepEqual(plan, want) {
		t.Errorf("got %v, want %v", plan, want)
	}
	for _, tc := range []struct {
		step  []int
		ranks int
		want  string
	}{
		{[]int{0, 0}, 1, "sample 0 is listed twice"},
		{[]int{9}, 1, "sample 9 is out of range (5 samples)"},
		{[]int{0}, 0, "dp ranks must be positive, got 0"},
	} {
		if _, err := Plan([]int{1, 1, 1, 1, 1}, tc.step, tc.ranks, 10); err == nil || err.Error() != tc.want {
			t.Errorf("Plan(%v, %d) error %v, want %q", tc.step, tc.ranks, err, tc.want)
		}
	}
}
