package stages

import (
	"context"
	"fmt"
	"os"

	"github.com/rlpipe/rlpipe/gpu"
)

// Without gradient clipping (train.grad_clip 0) AdamW of a unit needs only
// that unit's grads, not the global norm. On a rank whose trained model has
// its params and optimizer state offloaded, an update then starts each
// unit's host AdamW as soon as its grads have reached host memory in the
// update's last micro-batch (copied, or added by the host's cores), while
// the device goes on with the backward of earlier layers: earlyUpdate.
// The norm is still computed, for the metrics, after the backward. With
// clipping every unit's update waits for the norm, in the optimizer op
// (optimize).
//
// Units' grads reach the host in the backward's order, last layer first,
// and the next step's forward wants them in the other order; the updater
// takes, of the units whose grads have arrived, the lowest first, so that
// the units left when the backward ends are updated in forward order.

// earlyOn is RLPIPE_EARLY_ADAMW=0's switch (on by default), to time the
// early start against the optimizer op's and to test the two against each
// other.
var earlyOn = os.Getenv("RLPIPE_EARLY_ADAMW") != "0"

// earlyStarted, when set (by tests), is called as each early update starts.
var earlyStarted func()

// arrived is a unit whose shard's grads are final once ev completes and,
// when the reduction added into host memory (a later micro-batch's grads,
// or a tied slot's on several ranks), once after, the done channel of the
// last of those adds, is closed.
type arrived struct {
	ord   int
	ev    gpu.Event
	after <-chan struct{}
}

// earlyUpdate is an update's host AdamW started before the backward.
type earlyUpdate struct {
	h    *hostUpdate
	evs  chan arrived // the reductions' events, in the order recorded
	last []int        // by unit ordinal: the unit whose reduction writes its shard last
}

// early reports whether update up of the decoder's model starts its host
// AdamW early (see above).
func (s *Train) early(p *prog, d *decoder, up *update) bool {
	m := d.st.Model
	return earlyOn && p.job.Spec.Train.GradClip == 0 && m.Offload && m.OffloadOptimizer && len(up.micro) > 0 &&
		(!p.running() || (p.r.Profile == nil && !p.r.syncHostOptimizer))
}

// startEarly starts update up's host AdamW, each unit waiting for its
// grads (running), before the backward of the update's last micro-batch,
// whose reductions make them final. The previous update must be over: it
// settles it (earlier micro-batches' reductions waited for it unit by
// unit). The update becomes the shard's pending one only when its
// reductions have all been issued (endEarly): the backward's gathers and
// reductions must not wait for it.
func (d *decoder) startEarly(up *update) {
	p := d.p
	p.do(func() error {
		st := d.st
		if err := st.settle(); err != nil {
			return err
		}
		n := len(st.Units)
		e := &earlyUpdate{evs: make(chan arrived, n), last: make([]int, n)}
		// Reductions run from the head (the last unit) down to unit 0; a
		// tied slot writes its owner's shard.
		for o := range e.last {
			e.last[o] = n
		}
		for _, u := range st.Units {
			for _, s := range u.Slots {
				o := st.owner(u, s)
				e.last[o.ord] = min(e.last[o.ord], u.ord)
			}
		}
		lr := schedule(p.job.Spec.Train).At(up.Index)
		bg := p.r.hostBackground
		e.h = p.r.startHostUpdateAsArrived(p.ctx, st, e.evs, func(u *Unit) error {
			return adamw(bg, p, st, u, d.gradView, [4]*ref{}, 1, lr, up.Index+1)
		})
		d.early = e
		if earlyStarted != nil {
			earlyStarted()
		}
		return nil
	})
}

// arrive records, on s (the stream that stored unit u's grads), that the
// shards whose last writer u is are final (running, with an early update);
// added says the reduction queued host adds (hostAdder), which must be
// done too.
func (d *decoder) arrive(s gpu.Stream, u *Unit, added bool) error {
	e := d.early
	if e == nil {
		return nil
	}
	var after <-chan struct{}
	if added {
		after = d.adder.last
	}
	for o, w := range e.last {
		if w != u.ord {
			continue
		}
		ev, err := s.Record()
		if err != nil {
			return err
		}
		e.evs <- arrived{ord: o, ev: ev, after: after}
	}
	return nil
}

// endEarly ends the issue of an early update's reductions, which an error
// may have cut short, and makes it the shard's pending update.
func (d *decoder) endEarly() {
	e := d.early
	if e == nil {
		return
	}
	d.early = nil
	close(e.evs)
	d.st.pending = e.h
}

// startHostUpdateAsArrived runs step(u) for every unit of st as its grads
// arrive (evs, closed when no more will), the lowest unit first among
// those that have, on goroutines the rank's run waits for. A unit that
// never arrives fails the update. The caller makes it st's pending
// update.
func (r *Rank) startHostUpdateAsArrived(ctx context.Context, st *ShardState, evs <-chan arrived, step func(u *Unit) error) *hostUpdate {
	n := len(st.Units)
	h := newHostUpdate(n)
	ready := make(chan int, n)
	var syncErr error // set before ready is closed
	r.Background(func() {
		defer close(ready)
		for a := range evs {
			err := waitOff(a.ev)
			if cerr := a.ev.Close(); err == nil {
				err = cerr
			}
			if a.after != nil {
				<-a.after
			}
			if err != nil && syncErr == nil {
				syncErr = fmt.Errorf("waiting for %s's grads: %w", st.Units[a.ord].Name, err)
			}
			if syncErr == nil {
				ready <- a.ord
			}
		}
	})
	r.Background(func() {
		defer close(h.all)
		have, closed := make([]bool, n), make([]bool, n)
		waiting, open := 0, true
		take := func(o int) {
			if !have[o] && !closed[o] {
				have[o] = true
				waiting++
			}
		}
		for left := n; left > 0; left-- {
			for waiting == 0 && open {
				o, ok := <-ready
				if !ok {
					open = false
					break
				}
				take(o)
			}
			for drained := false; open && !drained; {
				select {
				case o, ok := <-ready:
					if !ok {
						open = false
					} else {
						take(o)
					}
				default:
					drained = true
				}
			}
			if waiting == 0 {
				break // no more will arrive
			}
			u := 0
			for !have[u] {
				u++
			}
			have[u], closed[u] = false, true
			waiting--
			if h.err == nil {
				if err := ctx.Err(); err != nil {
					h.err = err
				} else if err := step(st.Units[u]); err != nil {
					h.err = fmt.Errorf("AdamW on %s: %w", st.Units[u].Name, err)
				} else {
					h.updated[u] = true
				}
			}
			close(h.done[u])
		}
		for u, c := range closed {
			if c {
				continue
			}
			if h.err == nil {
				h.err = syncErr
			}
			if h.err == nil {
				h.err = fmt.Errorf("AdamW on %s: its grads never reached the host", st.Units[u].Name)
			}
			close(h.done[u])
		}
	})
	return h
}
