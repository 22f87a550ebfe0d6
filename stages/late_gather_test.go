package stages

import (
	"slices"
	"testing"

	"github.com/rlpipe/rlpipe/model"
)

// A forward gather waits for the MLP product of the layer before it only
// on one rank with the model on the device, and only where a decoder layer
// comes before it (not the embedding's, nor the first layer's: nothing
// would run beside them). TestStreamOrder's "on device" case runs them on
// lazy streams.
func TestLateGathers(t *testing.T) {
	units := []*Unit{{Unit: model.Unit{Kind: model.UnitEmbed}}, {Unit: model.Unit{Kind: model.UnitDecoder}},
		{Unit: model.Unit{Kind: model.UnitDecoder}}, {Unit: model.Unit{Kind: model.UnitHead}}}
	for _, c := range []struct {
		name    string
		world   int
		offload bool
		want    []bool // per unit
	}{
		{"one rank", 1, false, []bool{false, false, true, true}},
		{"one rank, offloaded", 1, true, []bool{false, false, false, false}},
		{"two ranks", 2, false, []bool{false, false, false, false}},
	} {
		d := &decoder{world: c.world, st: &ShardState{Model: &Model{Offload: c.offload}, Units: units}}
		for i, want := range c.want {
			if got := d.lateGathers(i); got != want {
				t.Errorf("%s: unit %d (%s): late %v, want %v", c.name, i, units[i].Kind, got, want)
			}
		}
	}
}

// flushGathers issues late gathers in the order they were declared: up to
// and including a given buffer's (the ones declared before it too, whose
// buffers the compute stream needs first), none when the buffer's is not
// waiting, and all of them for nil.
func TestFlushGathers(t *testing.T) {
	g := []*ref{{}, {}, {}}
	for _, c := range []struct {
		name  string
		flush []*ref // successive calls
		want  []int  // the gathers issued, in order
		left  int    // still deferred
	}{
		{"up to the second", []*ref{g[1]}, []int{0, 1}, 1},
		{"all", []*ref{nil}, []int{0, 1, 2}, 0},
		{"the first, then one not waiting", []*ref{g[0], {}}, []int{0}, 2},
		{"the last, then the first again", []*ref{g[2], g[0]}, []int{0, 1, 2}, 0},
	} {
		var issued []int
		d := &decoder{}
		for i := range g {
			d.deferred = append(d.deferred, deferredGather{g[i], func() error { issued = append(issued, i); return nil }})
		}
		for _, f := range c.flush {
			if err := d.flushGathers(f); err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(issued, c.want) || len(d.deferred) != c.left {
			t.Errorf("%s: issued %v with %d left, want %v with %d", c.name, issued, len(d.deferred), c.want, c.left)
		}
	}
}
