package stages

import (
	"os"
	"slices"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/runtime/plan"
)

// A tied embedding's grads on their way to an offloaded optimizer, on one
// rank: the head's reduction stores its grads of the embedding in host
// memory early in the backward, as any unit's, and its staging buffer
// stays on the device; the embedding's reduction, last in the backward,
// adds its own grads to that staged copy on the device (the device sums
// the squares of the total) and sends to the host only the rows that the
// micro-batch's tokens touched. Every other row of the embedding's own
// grads is zero, so the host already holds that row's total. Without this
// the embedding's whole grads crossed PCIe after the backward and were
// added into host memory there, and the host summed their squares, before
// the optimizer could start.
//
// In an update of several micro-batches the host adds every micro-batch's
// grads to the earlier ones' (hostAdder): the head's as before, and then
// of the embedding's own only the touched rows, gathered on the device
// into the head's staging buffer, which the head's grads have left by
// then, and added row by row on the host (addRows). The device does not
// see the totals there, and the host sums their squares. The plan keeps
// the head's staging buffer and the rows until the embedding's reduction
// has crossed.

// tiedRowsOn is RLPIPE_TIED_ROWS=0's switch (on by default), to time the
// path against the host's add and to test the two against each other.
var tiedRowsOn = os.Getenv("RLPIPE_TIED_ROWS") != "0"

// tiedRows reports whether a training decoder's model takes that path:
// one rank, its optimizer offloaded, a head with a tied embedding slot.
func (d *decoder) tiedRows() bool {
	if !tiedRowsOn || d.world != 1 || !d.st.Model.OffloadOptimizer {
		return false
	}
	h := d.st.Units[len(d.st.Units)-1]
	return h.Kind == model.UnitHead && slices.ContainsFunc(h.Slots, func(s model.Slot) bool { return s.Tied })
}

// planTiedRows declares io.rows, the sorted distinct token ids of the
// micro-batch (uploaded when running), when tiedRows; nil otherwise.
func (d *decoder) planTiedRows() *ref {
	if !d.tiedRows() {
		return nil
	}
	d.io.rows = d.p.buf(d.name("io.rows"), plan.IO, gpu.I32, d.T)
	if d.mb != nil {
		rows := slices.Clone(d.mb.Tokens)
		slices.Sort(rows)
		rows = slices.Compact(rows)
		d.rowsN = len(rows)
		d.p.do(func() error {
			dst, err := d.io.rows.t.Flat(0, len(rows))
			if err != nil {
				return err
			}
			if err := d.b().UploadI32(dst, rows); err != nil {
				return err
			}
			if d.onlyMicro || d.accOn {
				return nil
			}
			// The host's copy, for the host's adds of several
			// micro-batches (addRowsOnHost), which grads summed on the
			// device do not need.
			mem, err := d.p.r.Host.Alloc(int64(4 * len(rows)))
			if err != nil {
				return err
			}
			if d.rowsHost, err = gpu.NewTensor(mem, 0, gpu.I32, len(rows)); err != nil {
				return err
			}
			return d.p.r.Host.UploadI32(d.rowsHost, rows)
		})
	}
	return d.io.rows
}

// holdTied is reduce's planning of the held staging: at the head's
// reduction (staging d2h) it records the tied slot's staging as held; at
// the embedding's it returns the held buffer, extended (with the rows) to
// op, and forgets it. It returns nil otherwise.
func (d *decoder) holdTied(op int, u *Unit, d2h *ref) *ref {
	if d2h == nil || d.io.rows == nil {
		return nil
	}
	switch {
	case u.Kind == model.UnitHead:
		for k, s := range u.Slots {
			if s.Tied {
				d.tied, d.tiedSlot = d2h, k
			}
		}
	case u.ord == 0 && d.tied != nil:
		held := d.tied
		d.tied = nil
		until(op, held, d.io.rows)
		return held
	}
	return nil
}

// heldSlice is the tied slot's part of the head's held staging buffer.
func (d *decoder) heldSlice(held *ref) (gpu.Tensor, error) {
	return d.st.Units[len(d.st.Units)-1].sliceOf(held.t, d.tiedSlot)
}

// addHeld adds the head's held grads of the tied embedding to stg, the
// embedding's staged grads (the embedding unit's only slot).
func (d *decoder) addHeld(b gpu.Backend, stg gpu.Tensor, held *ref) error {
	hv, err := d.heldSlice(held)
	if err != nil {
		return err
	}
	return b.AddScaled(stg, hv, 1)
}

// rowViews views dst and src, slot sl's grads in host memory and staged,
// as [rows, H] matrices, with the micro-batch's distinct rows (io.rows).
func (d *decoder) rowViews(dst, src gpu.Tensor, sl model.Slot) (dv, sv, ids gpu.Tensor, err error) {
	rows, h := int(sl.Rows()), int(sl.RowElems())
	if dv, err = dst.Reshape(rows, h); err != nil {
		return
	}
	if sv, err = src.Reshape(rows, h); err != nil {
		return
	}
	ids, err = d.io.rows.t.Flat(0, d.rowsN)
	return
}

// sendRows copies the touched rows of the staged total src into the
// embedding's grad shard dst in host memory, on b.
func (d *decoder) sendRows(b gpu.Backend, dst, src gpu.Tensor, sl model.Slot) error {
	dv, sv, ids, err := d.rowViews(dst, src, sl)
	if err != nil {
		return err
	}
	return b.CopyRows(dv, sv, ids)
}

// addRowsOnHost queues the host's adds of the touched rows of src, the
// embedding's staged grads, into dst, its shard in host memory, which
// already holds the head's share (and earlier micro-batches' grads): b,
// issuing on s, gathers the rows into the held staging buffer, whose
// head's grads crossed on s before, and copies them through the ring in
// chunks of whole rows.
func (d *decoder) addRowsOnHost(b gpu.Backend, s gpu.Stream, dst, src gpu.Tensor, sl model.Slot, held *ref) error {
	if s == nil {
		s = b.DefaultStream()
	}
	n, h := d.rowsN, int(sl.RowElems())
	dv, sv, ids, err := d.rowViews(dst, src, sl)
	if err != nil {
		return err
	}
	hv, err := d.heldSlice(held)
	if err != nil {
		return err
	}
	cv, err := hv.Flat(0, n*h)
	if err != nil {
		return err
	}
	compact, err := cv.Reshape(n, h)
	if err != nil {
		return err
	}
	if err := b.Embedding(compact, sv, ids); err != nil {
		return err
	}
	per := max(d.ringElems/h, 1) // rows a ring slot holds
	for j := 0; j < n; j += per {
		m := min(per, n-j)
		k := d.adder.acquire()
		slot, err := d.ring.t.Flat(k*d.ringElems, k*d.ringElems+m*h)
		if err != nil {
			return err
		}
		part, err := compact.Flat(j*h, (j+m)*h)
		if err != nil {
			return err
		}
		if err := b.Copy(slot, part); err != nil {
			return err
		}
		ev, err := s.Record()
		if err != nil {
			return err
		}
		sr, err := slot.Reshape(m, h)
		if err != nil {
			return err
		}
		rv, err := d.rowsHost.Flat(j, j+m)
		if err != nil {
			return err
		}
		d.adder.addRows(k, ev, dv, sr, rv)
	}
	return nil
}
