package stages

import (
	"reflect"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/runtime/plan"
)

// A unit is read in place only on one rank with the model on the device
// and every slot's shard, the tied embedding's owner's included, in the
// unit's compute dtype.
func TestInPlace(t *testing.T) {
	embed := &Unit{Unit: model.Unit{Kind: model.UnitEmbed}, Slots: []model.Slot{{Name: "e"}}}
	layer := &Unit{Unit: model.Unit{Kind: model.UnitDecoder}, Slots: []model.Slot{{Name: "w"}}}
	head := &Unit{Unit: model.Unit{Kind: model.UnitHead}, Slots: []model.Slot{{Name: "n"}, {Name: "e", Tied: true}}}
	units := []*Unit{embed, layer, head}
	for _, c := range []struct {
		name    string
		world   int
		offload bool
		off     bool        // RLPIPE_GATHER_IN_PLACE=0
		master  []gpu.DType // per unit
		dts     []gpu.DType // per unit
		want    []bool      // per unit
	}{
		{"frozen bf16", 1, false, false, []gpu.DType{gpu.BF16, gpu.BF16, gpu.BF16}, []gpu.DType{gpu.BF16, gpu.BF16, gpu.BF16}, []bool{true, true, true}},
		{"fp32 master, bf16 compute", 1, false, false, []gpu.DType{gpu.F32, gpu.F32, gpu.F32}, []gpu.DType{gpu.BF16, gpu.BF16, gpu.BF16}, []bool{false, false, false}},
		{"fp32 master, fp32 head", 1, false, false, []gpu.DType{gpu.F32, gpu.F32, gpu.F32}, []gpu.DType{gpu.BF16, gpu.BF16, gpu.F32}, []bool{false, false, true}},
		{"tied embedding in another dtype", 1, false, false, []gpu.DType{gpu.BF16, gpu.F32, gpu.F32}, []gpu.DType{gpu.BF16, gpu.F32, gpu.F32}, []bool{true, true, false}},
		{"two ranks", 2, false, false, []gpu.DType{gpu.BF16, gpu.BF16, gpu.BF16}, []gpu.DType{gpu.BF16, gpu.BF16, gpu.BF16}, []bool{false, false, false}},
		{"offloaded", 1, true, false, []gpu.DType{gpu.BF16, gpu.BF16, gpu.BF16}, []gpu.DType{gpu.BF16, gpu.BF16, gpu.BF16}, []bool{false, false, false}},
		{"switched off", 1, false, true, []gpu.DType{gpu.BF16, gpu.BF16, gpu.BF16}, []gpu.DType{gpu.BF16, gpu.BF16, gpu.BF16}, []bool{false, false, false}},
	} {
		for i, u := range units {
			u.Master = c.master[i]
		}
		d := &decoder{world: c.world, dts: c.dts, st: &ShardState{Model: &Model{Offload: c.offload}, Units: units}}
		func() {
			defer func(v bool) { inPlaceOff = v }(inPlaceOff)
			inPlaceOff = c.off
			for i, want := range c.want {
				if got := d.inPlace(i); got != want {
					t.Errorf("%s: unit %d (%s): in place %v, want %v", c.name, i, units[i].Kind, got, want)
				}
			}
		}()
	}
}

// Reading the shards in place gives the bits the gathered copies gave:
// two steps of the embedded default (fp32: the actor's master and the ref
// read in place) and of its bf16 form (the ref in place, the actor's
// master cast into gathered units), with RLPIPE_GATHER_IN_PLACE on and
// off, give the same log-probs, grad norms and loss metrics, and the
// in-place plan gathers fewer bytes.
func TestInPlaceSameBits(t *testing.T) {
	for _, c := range []struct {
		name  string
		edits []string
	}{
		{"fp32", nil},
		{"bf16", []string{`  precision: '"fp32"'`, `  precision: '"bf16"'`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			runs, gathered := map[bool]*stepRun{}, map[bool]int64{}
			for _, off := range []bool{true, false} {
				func() {
					defer func(v bool) { inPlaceOff = v }(inPlaceOff)
					inPlaceOff = off
					runs[off] = runStep(t, tinyVariant(t, c.edits...), 1)
					p, err := Plan(runs[off].job)
					if err != nil {
						t.Fatal(err)
					}
					for _, b := range p.Buffers {
						if b.Kind == plan.Gathered {
							gathered[off] += b.Bytes
						}
					}
				}()
			}
			copied, inPlace := runs[true], runs[false]
			if len(inPlace.steps) != 2 || len(copied.steps) != 2 {
				t.Fatalf("steps: %d in place, %d copied, want 2", len(inPlace.steps), len(copied.steps))
			}
			for k, sr := range inPlace.steps {
				cs := copied.steps[k]
				if !reflect.DeepEqual(sr.Stats.Updates, cs.Stats.Updates) {
					t.Errorf("step %d: updates in place %+v, copied %+v", sr.Step, sr.Stats.Updates, cs.Stats.Updates)
				}
				for name, vals := range map[string][2]*TokenValues{"ref": {inPlace.ref[sr.Step], copied.ref[sr.Step]},
					"old": {inPlace.old[sr.Step], copied.old[sr.Step]}} {
					if !reflect.DeepEqual(vals[0], vals[1]) {
						t.Errorf("step %d: %s log-probs differ in place", sr.Step, name)
					}
				}
			}
			if gathered[false] >= gathered[true] {
				t.Errorf("gathered bytes: %d in place, %d copied, want fewer", gathered[false], gathered[true])
			}
		})
	}
}
