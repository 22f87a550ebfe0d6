package nccl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
)

// impls are the host-memory communicators the shared collective tests run
// on: both must give the same results.
var impls = []struct {
	name string
	new  func(t *testing.T, n int) []Comm
}{
	{"loopback", func(_ *testing.T, n int) []Comm { return NewLoopback(n) }},
	{"tcp", joinAll},
}

// freeAddr returns a local address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "127.0.0.1:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// join runs JoinTCP for the given ranks of a world of size n concurrently
// and returns their communicators and errors by rank.
func join(t *testing.T, n int, ranks []int, cfg TCPConfig) ([]Comm, []error) {
	t.Helper()
	cs, errs := make([]Comm, n), make([]error, n)
	var wg sync.WaitGroup
	for _, r := range ranks {
		wg.Go(func() {
			c := cfg
			c.Rank, c.Size = r, n
			c.Host = "host" + strconv.Itoa(r)
			cs[r], errs[r] = JoinTCP(context.Background(), c)
		})
	}
	wg.Wait()
	closeAtEnd(t, cs)
	return cs, errs
}

// joinAll joins n ranks over TCP on localhost.
func joinAll(t *testing.T, n int) []Comm {
	t.Helper()
	ranks := make([]int, n)
	for i := range ranks {
		ranks[i] = i
	}
	cs, errs := join(t, n, ranks, TCPConfig{Addr: freeAddr(t), Timeout: 10 * time.Second})
	noErrs(t, errs)
	return cs
}

func wantErr(t *testing.T, rank int, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("rank %d: no error, want one with %q", rank, parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("rank %d: error %q lacks %q", rank, err, p)
		}
	}
}

// TestTCPJoinErrors checks that joining fails with errors that say who is
// missing or wrong, and never hangs.
func TestTCPJoinErrors(t *testing.T) {
	t.Run("a rank never arrives", func(t *testing.T) {
		_, errs := join(t, 4, []int{0, 1}, TCPConfig{Addr: freeAddr(t), Timeout: 300 * time.Millisecond})
		wantErr(t, 0, errs[0], "ranks 2, 3 of 4 did not join within 300ms")
		wantErr(t, 1, errs[1], "rank 0 at", "did not start the job", "ranks 2, 3 of 4")
	})
	t.Run("rank 0 never arrives", func(t *testing.T) {
		_, errs := join(t, 2, []int{1}, TCPConfig{Addr: freeAddr(t), Timeout: 300 * time.Millisecond})
		wantErr(t, 1, errs[1], "rank 1 on host1: cannot reach rank 0 at 127.0.0.1:", "within 300ms")
	})
	t.Run("world sizes differ", func(t *testing.T) {
		addr := freeAddr(t)
		var errs [2]error
		var wg sync.WaitGroup
		for r, size := range []int{2, 3} {
			wg.Go(func() {
				_, errs[r] = JoinTCP(context.Background(), TCPConfig{Rank: r, Size: size, Addr: addr, Timeout: 5 * time.Second, Host: "h" + strconv.Itoa(r)})
			})
		}
		wg.Wait()
		wantErr(t, 0, errs[0], "rank 1 on h1", "has world size 3, rank 0 on h0 has 2")
		wantErr(t, 1, errs[1], "has world size 3")
	})
	t.Run("the same rank twice", func(t *testing.T) {
		addr := freeAddr(t)
		var e [3]error
		var wg sync.WaitGroup
		for i, r := range []int{0, 1, 1} {
			wg.Go(func() {
				_, e[i] = JoinTCP(context.Background(), TCPConfig{Rank: r, Size: 3, Addr: addr, Timeout: 5 * time.Second, Host: "h" + strconv.Itoa(i)})
			})
		}
		wg.Wait()
		wantErr(t, 0, e[0], "rank 1 joined twice")
	})
	t.Run("another job's rank is turned away", func(t *testing.T) {
		addr := freeAddr(t)
		cs := make([]Comm, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		wg.Go(func() {
			cs[0], errs[0] = JoinTCP(context.Background(), TCPConfig{Rank: 0, Size: 2, Addr: addr, Job: "ours", Timeout: 5 * time.Second})
		})
		_, stranger := JoinTCP(context.Background(), TCPConfig{Rank: 1, Size: 2, Addr: addr, Job: "other", Timeout: 5 * time.Second})
		wantErr(t, 1, stranger, `a rank of job "other"`, `rank 0 of job "ours"`)
		cs[1], errs[1] = JoinTCP(context.Background(), TCPConfig{Rank: 1, Size: 2, Addr: addr, Job: "ours", Timeout: 5 * time.Second})
		wg.Wait()
		noErrs(t, errs)
		noErrs(t, each(cs, func(c Comm) error { return c.Barrier(context.Background()) }))
		for _, c := range cs {
			c.Close()
		}
	})
}

// TestTCPLostRank drops a rank's connection without a word, as a killed
// process does: every other rank's collective fails naming it.
func TestTCPLostRank(t *testing.T) {
	for _, lost := range []int{0, 2} {
		t.Run("rank "+strconv.Itoa(lost), func(t *testing.T) {
			cs := joinAll(t, 3)
			ctx := context.Background()
			noErrs(t, each(cs, func(c Comm) error { return c.Barrier(ctx) }))
			for _, p := range cs[lost].(*tcpComm).peers {
				if p != nil {
					p.conn.Close()
				}
			}
			done := make(chan []error)
			go func() {
				done <- each(cs, func(c Comm) error {
					if c.Rank() == lost {
						return nil
					}
					return c.AllReduce(ctx, tensor(gpu.F32, []float32{1}), Sum)
				})
			}()
			select {
			case errs := <-done:
				for r, err := range errs {
					if r == lost {
						continue
					}
					if lost == 0 {
						// Rank 0's own side of the closed connections may
						// speak first, or the others notice rank 0 is gone.
						wantErr(t, r, err, "communicator aborted", "lost rank ")
					} else {
						wantErr(t, r, err, "communicator aborted", "lost rank 2 on host2 (pid ")
					}
				}
			case <-time.After(10 * time.Second):
				t.Fatal("hang: the other ranks did not notice the lost one")
			}
		})
	}
}

// TestTCPAbortCarriesTheCause checks that a rank's Abort reaches the others
// with its reason.
func TestTCPAbortCarriesTheCause(t *testing.T) {
	cs := joinAll(t, 3)
	errs := each(cs, func(c Comm) error {
		if c.Rank() == 1 {
			c.(*tcpComm).Abort(errorString("step 3: out of memory"))
			return nil
		}
		return c.Barrier(context.Background())
	})
	for _, r := range []int{0, 2} {
		wantErr(t, r, errs[r], "rank 1 on host1 failed: step 3: out of memory")
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }

// TestTCPCloseAfterLastCollective closes ranks in any order once they are
// done: results in flight still arrive.
func TestTCPCloseAfterLastCollective(t *testing.T) {
	for range 20 {
		cs := joinAll(t, 4)
		bufs := make([]gpu.Tensor, 4)
		noErrs(t, each(cs, func(c Comm) error {
			bufs[c.Rank()] = tensor(gpu.F32, rankVals(c.Rank(), 1000))
			if err := c.AllReduce(context.Background(), bufs[c.Rank()], Sum); err != nil {
				return err
			}
			return c.Close()
		}))
	}
}

// TestHostRing shifts blocks round two rings of two ranks sharing one
// communicator of four (cp groups {0,1} and {2,3}), on both host
// communicators.
func TestHostRing(t *testing.T) {
	for _, impl := range impls {
		cs := impl.new(t, 4)
		got := make([]gpu.Tensor, 4)
		noErrs(t, each(cs, func(c Comm) error {
			r := c.Rank()
			ring := HostRing{C: c, Members: []int{r / 2 * 2, r/2*2 + 1}}
			got[r] = tensor(gpu.F32, make([]float32, 2))
			return ring.Shift(context.Background(), []gpu.Tensor{tensor(gpu.F32, []float32{float32(r), float32(10 * r)})}, []gpu.Tensor{got[r]})
		}))
		for r, want := range []float32{1, 0, 3, 2} {
			equal(t, fmt.Sprintf("%s rank %d", impl.name, r), values(t, got[r]), []float32{want, 10 * want})
		}
		noErrs(t, each(cs, func(c Comm) error {
			if err := (HostRing{C: c, Members: []int{9}}).Shift(context.Background(), nil, nil); err == nil {
				return errors.New("a rank outside its ring was accepted")
			}
			return nil
		}))
	}
}

// closeAtEnd closes the test's communicators (nil ones skipped) when it
// ends.
func closeAtEnd(t *testing.T, cs []Comm) {
	t.Cleanup(func() {
		for _, c := range cs {
			if c != nil {
				c.Close()
			}
		}
	})
}
