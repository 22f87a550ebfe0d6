package stages

import (
	"encoding/binary"
	"math"
	"os"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/runtime/plan"
)

// deviceNorms has the device sum the squares of a unit's grads while they
// are still staged on it, on their way to an offloaded optimizer on the
// host, so that the optimizer op finds the unit's sum ready instead of
// reading its grads from host memory while the device idles.
//
// A staged unit's sum is its shard's only when the staging buffer holds
// exactly the shard: the update has one micro-batch on the rank (no host
// adds), the unit has no tied slot (its slice is its shard, in the same
// order), and nothing else writes its shard (a tied embedding gets the
// head's grads too). Any other write to a shard makes its sum invalid,
// and the optimizer op sums it on the host as before. The sums are
// SumSquares' own float64s (SumSquaresTo), one 8-byte slot a unit in a
// small buffer the optimizer op downloads once.
type deviceNorms struct {
	buf   *ref   // I32, 2 per unit: each unit's float64 sum
	valid []bool // by unit ordinal: its sum is its final shard's (running)
}

// deviceNormsOn is RLPIPE_DEVICE_NORMS=0's switch (on by default), to time
// the host's sums against the device's; normsServed, when set (by tests),
// is told how many units' sums each host optimizer update took from the
// device.
var (
	deviceNormsOn = os.Getenv("RLPIPE_DEVICE_NORMS") != "0"
	normsServed   func(n int)
)

// planDeviceNorms declares the sums' buffer when the optimizer runs on the
// host, live from now to the op the caller extends it to; nil otherwise.
func (d *decoder) planDeviceNorms() *ref {
	m := d.st.Model
	if !deviceNormsOn || !m.Offload || !m.OffloadOptimizer {
		d.devNorms = nil
		return nil
	}
	d.devNorms = &deviceNorms{buf: d.p.buf(d.p.stage.ID+".grad_sumsq", plan.Comm, gpu.I32, 2*len(d.st.Units)),
		valid: make([]bool, len(d.st.Units))}
	return d.devNorms.buf
}

// stagedWhole reports whether u's staged slice is laid out as its shard:
// no tied slot, and every slot at the same offset in both.
func stagedWhole(u *Unit) bool {
	if u.SliceElems != u.ShardElems {
		return false
	}
	for k, s := range u.Slots {
		if s.Tied || s.ShardOffset != u.SliceOff[k] {
			return false
		}
	}
	return true
}

// sumStaged queues, on b, the sum of squares of staged, unit u's grads on
// their way to the host, when they are its whole shard's final grads: the
// update's only micro-batch, and every slot a store (stores). It marks the
// sum valid; a later write to the shard (wrote) clears it.
func (n *deviceNorms) sumStaged(b gpu.Backend, u *Unit, staged gpu.Tensor, only, stores bool) error {
	if !only || !stores || !stagedWhole(u) {
		n.valid[u.ord] = false
		return nil
	}
	return n.sumShard(b, u, staged)
}

// sumShard queues, on b, the sum of squares of shard, unit u's whole fp32
// grads, into u's entry.
func (n *deviceNorms) sumShard(b gpu.Backend, u *Unit, shard gpu.Tensor) error {
	n.valid[u.ord] = false
	if u.ShardElems == 0 {
		return nil
	}
	dst, err := n.buf.t.Flat(2*u.ord, 2*u.ord+2)
	if err != nil {
		return err
	}
	if err := b.SumSquaresTo(dst, shard); err != nil {
		return err
	}
	n.valid[u.ord] = true
	return nil
}

// wrote records a write to unit ord's shard after its sum was taken.
func (n *deviceNorms) wrote(ord int) { n.valid[ord] = false }

// sums downloads the buffer and returns each unit's sum and whether it is
// valid (b waits for the device).
func (n *deviceNorms) sums(b gpu.Backend) ([]float64, error) {
	return downloadSums(b, n.buf.t, len(n.valid))
}

// downloadSums downloads the first n float64s of t (b waits for the
// device).
func downloadSums(b gpu.Backend, t gpu.Tensor, n int) ([]float64, error) {
	raw := make([]byte, 8*n)
	if err := b.DownloadBytes(raw, t); err != nil {
		return nil, err
	}
	out := make([]float64, n)
	for k := range out {
		out[k] = math.Float64frombits(binary.LittleEndian.Uint64(raw[8*k:]))
	}
	return out, nil
}

// unitSums queues, on b, each unit's sum of squares of its grads (read
// through grads) into its 8-byte slot of buf, then downloads buf once (b
// waits for the device) and returns the sums by unit ordinal: the values
// SumSquares returns, without a wait for each unit.
func unitSums(b gpu.Backend, buf gpu.Tensor, units []*Unit, grads func(*Unit) (gpu.Tensor, error)) ([]float64, error) {
	for _, u := range units {
		g, err := grads(u)
		if err != nil {
			return nil, err
		}
		dst, err := buf.Flat(2*u.ord, 2*u.ord+2)
		if err != nil {
			return nil, err
		}
		if err := b.SumSquaresTo(dst, g); err != nil {
			return nil, err
		}
	}
	return downloadSums(b, buf, len(units))
}
