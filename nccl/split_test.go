package nccl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
)

// splitAll runs Split on every rank of parents concurrently, rank r with
// cfg(r), and returns the groups' communicators and errors by parent rank.
func splitAll(t *testing.T, parents []Comm, cfg func(r int) SplitConfig) ([]Comm, []error) {
	t.Helper()
	cs, errs := make([]Comm, len(parents)), make([]error, len(parents))
	var wg sync.WaitGroup
	for r, p := range parents {
		wg.Go(func() {
			c := cfg(r)
			if c.Timeout == 0 {
				c.Timeout = 10 * time.Second
			}
			cs[r], errs[r] = Split(context.Background(), p, c)
		})
	}
	wg.Wait()
	closeAtEnd(t, cs)
	return cs, errs
}

// within runs fn on every rank and fails the test if it has not returned
// within 10 seconds (a hang).
func within(t *testing.T, cs []Comm, fn func(c Comm, r int) error) []error {
	t.Helper()
	done := make(chan []error, 1)
	go func() {
		errs := make([]error, len(cs))
		var wg sync.WaitGroup
		for r, c := range cs {
			if c != nil {
				wg.Go(func() { errs[r] = fn(c, r) })
			}
		}
		wg.Wait()
		done <- errs
	}()
	select {
	case errs := <-done:
		return errs
	case <-time.After(10 * time.Second):
		t.Fatal("hang: a rank is still waiting after 10s")
		return nil
	}
}

// TestSplit splits loopback and TCP communicators into groups by color
// and key, and checks each group's ranks, an all-reduce over the group
// (interleaved with one over the parent), a ring shift round the group
// (nccl.HostRing, as context parallelism passes keys and values) and a
// barrier.
func TestSplit(t *testing.T) {
	tests := []struct {
		name       string
		n          int
		color, key func(r int) int
		groups     [][]int // parent ranks of each group, in group order
	}{
		{"cp groups of 2 (dp 2 × cp 2)", 4, func(r int) int { return r / 2 }, func(r int) int { return r % 2 }, [][]int{{0, 1}, {2, 3}}},
		{"cp groups of 3 (dp 2 × cp 3)", 6, func(r int) int { return r / 3 }, func(r int) int { return r % 3 }, [][]int{{0, 1, 2}, {3, 4, 5}}},
		{"keys reverse the order", 4, func(r int) int { return r % 2 }, func(r int) int { return -r }, [][]int{{2, 0}, {3, 1}}},
		{"equal keys keep the parent's order", 3, func(int) int { return 7 }, func(int) int { return 0 }, [][]int{{0, 1, 2}}},
		{"groups of one", 3, func(r int) int { return r }, func(int) int { return 0 }, [][]int{{0}, {1}, {2}}},
		{"one rank", 1, func(int) int { return 0 }, func(int) int { return 0 }, [][]int{{0}}},
	}
	for _, impl := range impls {
		for _, tc := range tests {
			t.Run(impl.name+" "+tc.name, func(t *testing.T) {
				parents := impl.new(t, tc.n)
				cs, errs := splitAll(t, parents, func(r int) SplitConfig { return SplitConfig{Color: tc.color(r), Key: tc.key(r)} })
				noErrs(t, errs)
				groupOf := make([][]int, tc.n)
				for _, g := range tc.groups {
					for i, r := range g {
						groupOf[r] = g
						if cs[r].Rank() != i || cs[r].Size() != len(g) {
							t.Fatalf("parent rank %d is rank %d of %d, want %d of %d", r, cs[r].Rank(), cs[r].Size(), i, len(g))
						}
					}
				}
				ctx := context.Background()
				sums, worlds, got := make([]gpu.Tensor, tc.n), make([]gpu.Tensor, tc.n), make([]gpu.Tensor, tc.n)
				noErrs(t, within(t, cs, func(c Comm, r int) error {
					sums[r] = tensor(gpu.F32, rankVals(r, 3))
					if err := c.AllReduce(ctx, sums[r], Sum); err != nil {
						return err
					}
					worlds[r] = tensor(gpu.F32, []float32{float32(r)})
					if err := parents[r].AllReduce(ctx, worlds[r], Sum); err != nil {
						return err
					}
					got[r] = tensor(gpu.F32, make([]float32, 2))
					if err := (HostRing{C: c}).Shift(ctx, []gpu.Tensor{tensor(gpu.F32, []float32{float32(r), float32(10 * r)})}, []gpu.Tensor{got[r]}); err != nil {
						return err
					}
					return c.Barrier(ctx)
				}))
				for r := range tc.n {
					g := groupOf[r]
					want := make([]float32, 3)
					for _, q := range g {
						for i, v := range rankVals(q, 3) {
							want[i] += v
						}
					}
					equal(t, fmt.Sprintf("rank %d group all-reduce", r), values(t, sums[r]), want)
					equal(t, fmt.Sprintf("rank %d parent all-reduce", r), values(t, worlds[r]), []float32{float32(tc.n * (tc.n - 1) / 2)})
					i := slices.Index(g, r)
					prev := float32(g[(i+len(g)-1)%len(g)])
					equal(t, fmt.Sprintf("rank %d shift", r), values(t, got[r]), []float32{prev, 10 * prev})
				}
			})
		}
	}
}

// TestSplitBadConfig checks that a color or key out of range fails every
// rank, the others naming the rank that passed it.
func TestSplitBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  SplitConfig
		want string
	}{
		{"negative color", SplitConfig{Color: -1}, "color -1 outside [0,2³¹)"},
		{"color over 32 bits", SplitConfig{Color: 1 << 31}, "color 2147483648 outside"},
		{"key over 32 bits", SplitConfig{Key: 1 << 40}, "key 1099511627776 does not fit in 32 bits"},
	}
	for _, impl := range impls {
		for _, tc := range tests {
			t.Run(impl.name+" "+tc.name, func(t *testing.T) {
				parents := impl.new(t, 3)
				_, errs := splitAll(t, parents, func(r int) SplitConfig {
					if r == 1 {
						return tc.cfg
					}
					return SplitConfig{Color: 0, Key: r}
				})
				wantErr(t, 1, errs[1], tc.want)
				for _, r := range []int{0, 2} {
					wantErr(t, r, errs[r], "rank 1 passed a color or key out of range")
				}
			})
		}
	}
}

// TestSplitFailures checks that a group's ranks fail with an error naming
// the rank, and never hang, when one of them dies (its connections drop),
// when one's context is cancelled in a collective, when the parent fails
// after the split or during the group's join, and that closing the parent
// leaves the groups working.
func TestSplitFailures(t *testing.T) {
	cp := func(r int) SplitConfig {
		return SplitConfig{Color: r / 3, Key: r % 3, Name: fmt.Sprintf("cp group %d", r/3)}
	}
	allReduce := func(c Comm, ctx context.Context) error {
		return c.AllReduce(ctx, tensor(gpu.F32, []float32{1, 2}), Sum)
	}
	t.Run("a group's rank dies", func(t *testing.T) {
		for _, lost := range []int{3, 5} { // group rank 0 (its hub) and 2 of group 1
			t.Run(fmt.Sprintf("parent rank %d", lost), func(t *testing.T) {
				parents := joinAll(t, 6)
				cs, errs := splitAll(t, parents, cp)
				noErrs(t, errs)
				for _, p := range cs[lost].(*tcpComm).peers {
					if p != nil {
						p.conn.Close()
					}
				}
				errs = within(t, cs, func(c Comm, r int) error {
					if r == lost || r < 3 {
						return nil
					}
					return allReduce(c, context.Background())
				})
				for r := 3; r < 6; r++ {
					if r == lost {
						continue
					}
					if lost == 3 {
						// The hub's own side of the closed connections may
						// speak first, or the others notice it is gone.
						wantErr(t, r, errs[r], "cp group 1: communicator aborted", "lost rank ")
					} else {
						wantErr(t, r, errs[r], "cp group 1: communicator aborted", fmt.Sprintf("lost rank 2 on host%d (pid ", lost))
					}
				}
				// The other group does not depend on it.
				noErrs(t, within(t, cs[:3], func(c Comm, _ int) error { return allReduce(c, context.Background()) }))
			})
		}
	})
	t.Run("a rank's context is cancelled in a collective", func(t *testing.T) {
		for _, impl := range impls {
			t.Run(impl.name, func(t *testing.T) {
				parents := impl.new(t, 6)
				cs, errs := splitAll(t, parents, cp)
				noErrs(t, errs)
				errs = within(t, cs, func(c Comm, r int) error {
					switch {
					case r == 4:
						ctx, cancel := context.WithCancel(context.Background())
						cancel()
						return allReduce(c, ctx)
					case r >= 3:
						return allReduce(c, context.Background())
					}
					return nil
				})
				for _, r := range []int{3, 4, 5} {
					wantErr(t, r, errs[r], "communicator aborted", "rank 1", "context canceled")
				}
			})
		}
	})
	t.Run("the parent fails after the split", func(t *testing.T) {
		parents := joinAll(t, 6)
		cs, errs := splitAll(t, parents, cp)
		noErrs(t, errs)
		parents[4].(*tcpComm).Abort(errors.New("step 3: out of memory"))
		for r, c := range cs {
			select {
			case <-c.(*tcpComm).Done():
			case <-time.After(10 * time.Second):
				t.Fatalf("parent rank %d: the group was not aborted with its parent", r)
			}
		}
		errs = within(t, cs, func(c Comm, _ int) error { return allReduce(c, context.Background()) })
		for r := range 6 {
			wantErr(t, r, errs[r], fmt.Sprintf("cp group %d: communicator aborted: parent communicator aborted", r/3), "rank 4 on host4 failed: step 3: out of memory")
		}
	})
	t.Run("closing the parent leaves the groups", func(t *testing.T) {
		parents := joinAll(t, 6)
		cs, errs := splitAll(t, parents, cp)
		noErrs(t, errs)
		for _, p := range parents {
			p.Close()
		}
		time.Sleep(50 * time.Millisecond) // let the closes arrive
		noErrs(t, within(t, cs, func(c Comm, _ int) error { return allReduce(c, context.Background()) }))
	})
	t.Run("a rank dies while the group joins", func(t *testing.T) {
		parents := joinAll(t, 4)
		dead, bury := context.WithCancel(context.Background())
		splitJoinHook = func(r int) {
			if r == 3 { // group 1's rank 1 dies before it connects
				for _, p := range parents[3].(*tcpComm).peers {
					if p != nil {
						p.conn.Close()
					}
				}
				<-dead.Done() // a dead process says nothing more
			}
		}
		defer func() { bury(); splitJoinHook = nil }()
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for r := range 3 {
			wg.Go(func() {
				var c Comm
				c, errs[r] = Split(context.Background(), parents[r], SplitConfig{Color: r / 2, Key: r % 2, Name: fmt.Sprintf("cp group %d", r/2), Timeout: time.Minute})
				if c != nil {
					c.Close()
				}
			})
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		var ghost sync.WaitGroup
		ghost.Go(func() { Split(dead, parents[3], SplitConfig{Color: 1, Key: 1, Timeout: time.Minute}) })
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("hang: group 1's rank 0 still waits for the dead rank")
		}
		bury()
		ghost.Wait()
		// Group 1's rank 0 learns it from the parent, in its last exchange
		// or while it waits for the dead rank to connect.
		wantErr(t, 2, errs[2], "lost rank 3 on host3 (pid ")
	})
	t.Run("the context is cancelled while the group joins", func(t *testing.T) {
		parents := joinAll(t, 2)
		ctx, cancel := context.WithCancel(context.Background())
		splitJoinHook = func(r int) {
			if r == 0 {
				cancel()
			}
		}
		defer func() { splitJoinHook = nil }()
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for r := range 2 {
			wg.Go(func() {
				c := context.Background()
				if r == 0 {
					c = ctx
				}
				var g Comm
				g, errs[r] = Split(c, parents[r], SplitConfig{Key: r, Timeout: 2 * time.Second})
				if errs[r] != nil {
					parents[r].(*tcpComm).Abort(errs[r]) // as the process would on its way out
				} else {
					g.Close()
				}
			})
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("hang after a cancelled split")
		}
		wantErr(t, 0, errs[0], "group 0: tcp: rank 0 on host0", "context canceled")
		if errs[1] == nil || !strings.Contains(errs[1].Error(), "group 0") {
			t.Errorf("rank 1: %v, want the group's failure", errs[1])
		}
	})
}
