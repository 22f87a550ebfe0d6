package stages

import (
	"context"
	"fmt"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
)

// hostUpdate is an optimizer update running on the host's cores in the
// background: with a model's master params and optimizer state both in
// pinned host memory, AdamW of unit 0, 1, ... runs while the device goes on
// with work that does not read them (the next step's reference forward, the
// actor's forward up to the unit being updated). Each unit's channel closes
// when its AdamW is done; everything that reads or writes a unit's params,
// grads or moments waits for it first (ShardState.settleUnit, settle).
type hostUpdate struct {
	done    []chan struct{} // by unit ordinal: closed when that unit is updated or skipped
	updated []bool          // by unit ordinal: set before done closes
	all     chan struct{}   // closed when the whole update has finished
	err     error           // the update's error, set before all is closed
}

// startHostUpdate runs step(u) for every unit of st in order on a goroutine
// that the rank's run waits for before it frees its memory, and records it
// as st's pending update. The caller must have settled any earlier update.
func (r *Rank) startHostUpdate(ctx context.Context, st *ShardState, step func(u *Unit) error) {
	h := newHostUpdate(len(st.Units))
	st.pending = h
	r.Background(func() {
		defer close(h.all)
		for i, u := range st.Units {
			if h.err == nil {
				if err := ctx.Err(); err != nil {
					h.err = err
				} else if err := step(u); err != nil {
					h.err = fmt.Errorf("AdamW on %s: %w", u.Name, err)
				} else {
					h.updated[i] = true
				}
			}
			close(h.done[i])
		}
	})
}

// newHostUpdate returns the update of n units, none done.
func newHostUpdate(n int) *hostUpdate {
	h := &hostUpdate{done: make([]chan struct{}, n), updated: make([]bool, n), all: make(chan struct{})}
	for i := range h.done {
		h.done[i] = make(chan struct{})
	}
	return h
}

// settleUnit waits until unit u's shard is no longer written by a pending
// host update. It returns the update's error, if it failed before
// updating u.
func (st *ShardState) settleUnit(u *Unit) error {
	h := st.pending
	if h == nil {
		return nil
	}
	<-h.done[u.ord]
	if !h.updated[u.ord] {
		return st.settle()
	}
	return nil
}

// settle waits for st's pending host update to finish and returns its error.
// The rank's goroutine alone calls it (and starts updates), so st.pending
// needs no lock: the update's goroutine only closes channels.
func (st *ShardState) settle() error {
	h := st.pending
	if h == nil {
		return nil
	}
	<-h.all
	st.pending = nil
	return h.err
}

// settle waits for the pending host updates of every model of the rank.
func (r *Rank) settle() error {
	for _, st := range r.shards() {
		if err := st.settle(); err != nil {
			return err
		}
	}
	return nil
}

// querier is an event that can be asked whether it has completed without
// waiting (the CUDA backend's).
type querier interface{ Query() (bool, error) }

// waitOff waits for ev on a goroutine other than the rank's. An event that
// can be queried is polled: the CUDA backend's Sync holds the device's
// driver thread for as long as it waits, and the rank could issue no work
// meanwhile.
func waitOff(ev gpu.Event) error {
	q, ok := ev.(querier)
	if !ok {
		return ev.Sync()
	}
	for d := 10 * time.Microsecond; ; d = min(2*d, 400*time.Microsecond) {
		done, err := q.Query()
		if err != nil || done {
			return err
		}
		time.Sleep(d)
	}
}
