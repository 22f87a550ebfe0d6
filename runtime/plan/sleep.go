package plan

import (
	"fmt"
	"sort"
)

// SleepArea is the name of the pinned host buffer that holds the device
// state while the trainer sleeps.
const SleepArea = "sleep.saved"

// SleepPoint is one sleep of the plan: the op after which the main device
// arena is released, and the buffers it copies to the host area first.
type SleepPoint struct {
	Op    int     `json:"op"`
	Stage string  `json:"stage"`
	Saved []Saved `json:"saved"`
	Bytes int64   `json:"bytes"` // the sum of Saved
}

// Saved is a device buffer a sleep copies to the pinned host area: its
// offset in the main device arena and its offset in the host arena.
type Saved struct {
	Buffer       string `json:"buffer"`
	Bytes        int64  `json:"bytes"`
	DeviceOffset int64  `json:"-"`
	HostOffset   int64  `json:"host_offset"`
	buf          *Buffer
}

// planSleeps fills p.Sleeps from the builder's marks and returns the host
// area. A sleep copies the device buffers live after it: those live at its
// op and later, and the persistent ones (the phase repeats, so they are
// live again after a sleep at its end). The area is as large as the
// largest sleep's copy and lives over the phase of the sleeps (all in one
// phase). Saved host offsets are relative to the area until Finish places
// it.
func (b *Builder) planSleeps(p *Plan) (*Buffer, error) {
	phase := func(op int) (name string, first, last int) {
		for _, s := range p.Stages {
			if s.First <= op && op <= s.Last {
				first, last = s.First, s.Last
				for _, t := range p.Stages {
					if t.Phase == s.Phase {
						first, last = min(first, t.First), max(last, t.Last)
					}
				}
				return s.Phase, first, last
			}
		}
		return "", 0, -1
	}
	ph, first, last := phase(b.sleeps[0])
	for _, op := range b.sleeps {
		if q, _, _ := phase(op); q != ph {
			return nil, fmt.Errorf("plan: sleep marks in phases %q and %q: they must share one phase", ph, q)
		}
	}
	persistent := map[*Buffer]bool{}
	for _, buf := range b.persist {
		persistent[buf] = true
	}
	var most int64
	for _, op := range b.sleeps {
		sp := SleepPoint{Op: op, Stage: p.Ops[op].Stage}
		for _, buf := range b.bufs {
			if !buf.Host && !buf.Resident && buf.Bytes > 0 && buf.Start <= op && (op < buf.End || persistent[buf]) {
				sp.Saved = append(sp.Saved, Saved{Buffer: buf.Name, Bytes: buf.Bytes, buf: buf})
			}
		}
		sort.Slice(sp.Saved, func(i, j int) bool { return sp.Saved[i].Buffer < sp.Saved[j].Buffer })
		for i := range sp.Saved {
			sp.Saved[i].HostOffset = sp.Bytes
			sp.Bytes += sp.Saved[i].Bytes
		}
		most = max(most, sp.Bytes)
		p.Sleeps = append(p.Sleeps, sp)
	}
	return &Buffer{Name: SleepArea, Kind: SleepCopy, Bytes: AlignUp(most), Host: true, Stage: p.Ops[b.sleeps[0]].Stage, Start: first, End: last}, nil
}

// setDeviceOffsets copies the saved buffers' device offsets, known once the
// main arena is assigned.
func (p *Plan) setDeviceOffsets() {
	for i := range p.Sleeps {
		for k := range p.Sleeps[i].Saved {
			p.Sleeps[i].Saved[k].DeviceOffset = p.Sleeps[i].Saved[k].buf.Offset
		}
	}
}
