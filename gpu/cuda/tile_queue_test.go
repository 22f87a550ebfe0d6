//go:build cgo

package cuda

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// TestTileQueue holds the persistent products' tile queue (kernels/
// hopper.cuh: the CTAs take tiles from a counter that each launch leaves
// zero for the next) to its contract: launches of the fused gate/up
// product with more tiles than SMs and with fewer, interleaved on one
// stream and issued on two streams at once, each give the bits of the
// shape's first run. A counter left past zero by a launch would make the
// next skip tiles, whose outputs stay NaN; two streams sharing one would
// split a launch's tiles between two products. It skips where the kernel
// does not run (not Hopper).
func TestTileQueue(t *testing.T) {
	e := newEnv(t)
	s, err := e.g.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	side := e.g.On(s)
	type run struct {
		x, g, u, want gpu.Tensor
	}
	// 2176 rows by 1024 columns: 17 × 11 tiles, more than an H100's
	// 132 SMs; 130 by 8: 2 tiles, 2 CTAs.
	var runs []run
	for _, c := range []gateUpShape{{2176, 320, 1024}, {130, 64, 8}} {
		x, _ := e.in(gpu.BF16, 1, c.t, c.k)
		g, _ := e.in(gpu.BF16, 0.1, c.n, c.k)
		u, _ := e.in(gpu.BF16, 0.1, c.n, c.k)
		want, _ := e.out(gpu.BF16, c.t, c.n)
		err := e.g.GateUpSwiGLU(want, x, g, u)
		if errors.Is(err, gpu.ErrNotFused) {
			t.Skipf("%v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, run{x, g, u, want})
	}
	// Every output poisoned first, then every launch issued on both
	// streams without a sync between them, so that the two streams' run
	// together.
	type launchOf struct {
		name string
		b    gpu.Backend
		r    run
		got  gpu.Tensor
	}
	var ls []launchOf
	for round := range 3 {
		for i, r := range runs {
			for _, on := range []struct {
				name string
				b    gpu.Backend
			}{{"default stream", e.g}, {"second stream", side}} {
				got, _ := e.out(gpu.BF16, r.want.Shape...)
				ls = append(ls, launchOf{fmt.Sprintf("round %d, shape %d, %s", round, i, on.name), on.b, r, got})
			}
		}
	}
	if err := e.g.Sync(); err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		f := l.b.(interface {
			GateUpSwiGLU(act, x, gate, up gpu.Tensor) error
		})
		if err := f.GateUpSwiGLU(l.got, l.r.x, l.r.g, l.r.u); err != nil {
			t.Fatalf("%s: %v", l.name, err)
		}
	}
	if err := e.g.Sync(); err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		e.sameBits(l.name+" against the shape's first run", l.got, l.r.want)
	}
}

// TestTileQueueBytes holds the shared memory the host asks for the tile
// queue (tileQueueBytes, part of each persistent product's) to the queue
// that kernels/hopper.cuh lays out: TQ_N slots of two 8-byte mbarriers and
// a 4-byte int. It needs no GPU.
func TestTileQueueBytes(t *testing.T) {
	src, err := kernelFS.ReadFile("kernels/hopper.cuh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^#define TQ_N (\d+)$`).FindSubmatch(src)
	if m == nil {
		t.Fatal("kernels/hopper.cuh defines no TQ_N")
	}
	n, err := strconv.Atoi(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	if want := n * (2*8 + 4); tileQueueBytes != want {
		t.Errorf("tileQueueBytes = %d, want %d for TQ_N %d", tileQueueBytes, want, n)
	}
}
