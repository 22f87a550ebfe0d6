package stages

import (
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
