package stages

import (
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
)

// A queued sum waits for the host adds queued before it, serves the sum
// of squares of the shard as it then is, and is stale once the shard is
// written again; a unit never queued is not served; a failed sum is
// reported at wait.
func TestHostNorms(t *testing.T) {
	b := cpu.New()
	ten := hostF32(t, b, 16)
	ev := func() gpu.Event {
		e, err := b.DefaultStream().Record()
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	g0, g1, g2 := ten(0, 1, 2), ten(2, 3), ten(4, 5)
	a := newHostAdder(b)
	a.add(a.acquire(), ev(), g0, ten(8, 1, 1)) // g0 becomes {2, 3} before its sum
	h := newHostNorms(b, 4)
	h.wrote(0)
	h.queue(0, g0, ev(), a.last)
	h.wrote(1)
	h.queue(1, g1, ev(), nil)
	h.queue(2, g2, ev(), nil)
	h.wrote(2) // written after its sum was queued
	if err := h.wait(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ord  int
		want float64
		ok   bool
	}{{0, 13, true}, {1, 9, true}, {2, 25, false}, {3, 0, false}} {
		got, ok := h.sum(c.ord)
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("unit %d: sum %v served %v, want %v %v", c.ord, got, ok, c.want, c.ok)
		}
	}
	h.queue(3, gpu.Tensor{}, ev(), nil) // not a float tensor
	if err := h.wait(); err == nil {
		t.Error("wait after a failed sum: no error")
	}
}
