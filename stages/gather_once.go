package stages

import "github.com/rlpipe/rlpipe/runtime/plan"

// With apply_fsdp2's gather_once a stage that computes with the model
// gathers each unit once over its micro-batches (the train stage once an
// update): the first micro-batch's forward gathers it, as always, but into
// a buffer declared before the micro-batches (kept), which lives until
// the last one is done (the train stage's optimizer step, the log-prob
// stages' sharing of their values). The backward, and the later
// micro-batches' forwards and backwards, use it as it is. An offloaded
// model's params then cross PCIe once instead of once or twice a
// micro-batch, and a sharded one is all-gathered once; every unit's
// compute copy is on the device at once, the stage (or update) long. The
// staging buffers of a gather live only until its unit's first forward,
// as without the option. The numbers are the same bits (TestGatherOnce).

// gatherIssued, set only by tests, is called for each gather issued, with
// the stage's ID and the unit.
var gatherIssued func(stage string, u *Unit)

// regather reports whether the backward gathers each unit again: with
// reshard_after_forward, unless the units are kept (gather_once).
func (d *decoder) regather() bool { return d.kept == nil && d.st.Fsdp.ReshardAfterForward }

// planKept declares, under gather_once, every unit's compute copy for the
// micro-batches to come (kept), in the size its gather fills, and returns
// them for the caller to extend to the last one's end; nil otherwise.
func (d *decoder) planKept() []*ref {
	d.kept, d.keptFilled = nil, false
	if !d.st.GatherOnce {
		return nil
	}
	d.kept = make([]*ref, len(d.st.Units))
	for i, u := range d.st.Units {
		lo, hi := d.gatherSpan(i)
		if lo == hi {
			d.kept[i] = &ref{} // read in place: gather declares nothing
			continue
		}
		d.kept[i] = d.p.buf(d.name("kept", u.Name), plan.Gathered, d.dts[i], int(hi-lo))
	}
	return d.kept
}
