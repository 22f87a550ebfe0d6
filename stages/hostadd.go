package stages

import (
	"sync"

	"github.com/rlpipe/rlpipe/gpu"
)

// hostAddSlots is the number of slots of the host grad ring, and
// hostAddChunk the most elements a slot holds: a shard larger than that is
// added chunk by chunk.
const (
	hostAddSlots = 4
	hostAddChunk = 32 << 20
)

// hostAdder adds device grads into offloaded (host) grads on the host's
// cores. The device copies a chunk into a slot of a pinned host ring (DMA,
// in stream order) and records an event; a goroutine waits for the event,
// adds the slot into its destination and frees the slot. Adds run one at a
// time in the order they were queued, so two adds into one shard (a tied
// weight) keep their order. The alternative, a device kernel reading and
// writing host memory across PCIe, stalls the device for the whole transfer
// in both directions.
type hostAdder struct {
	host gpu.Backend
	free []chan struct{} // a token in free[k] when slot k is free
	next int
	last chan struct{} // closed when the latest queued add is done
	wg   sync.WaitGroup
	mu   sync.Mutex
	err  error
}

func newHostAdder(host gpu.Backend) *hostAdder {
	a := &hostAdder{host: host, free: make([]chan struct{}, hostAddSlots)}
	for k := range a.free {
		a.free[k] = make(chan struct{}, 1)
		a.free[k] <- struct{}{}
	}
	return a
}

// acquire returns the next slot, waiting until its previous add is done.
func (a *hostAdder) acquire() int {
	k := a.next
	a.next = (k + 1) % len(a.free)
	<-a.free[k]
	return k
}

// add queues dst += src (src is slot k of the ring) after event ev.
func (a *hostAdder) add(k int, ev gpu.Event, dst, src gpu.Tensor) {
	a.queue(k, ev, func() error { return a.host.AddScaled(dst, src, 1) })
}

// addRows queues dst[rows[j]] += src[j] for the rows of src (slot k of
// the ring), rows a host I32 tensor of distinct rows, after event ev: each
// row's sum is dst's plus src's, as add's.
func (a *hostAdder) addRows(k int, ev gpu.Event, dst, src, rows gpu.Tensor) {
	a.queue(k, ev, func() error { return a.host.EmbeddingBackward(dst, src, rows) })
}

// queue runs op, which reads slot k, once event ev has completed and the
// op queued before it is done, and then frees the slot.
func (a *hostAdder) queue(k int, ev gpu.Event, op func() error) {
	prev, done := a.last, make(chan struct{})
	a.last = done
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer close(done)
		defer func() { a.free[k] <- struct{}{} }()
		err := waitOff(ev)
		ev.Close()
		if prev != nil {
			<-prev
		}
		if err == nil {
			err = op()
		}
		if err != nil {
			a.mu.Lock()
			if a.err == nil {
				a.err = err
			}
			a.mu.Unlock()
		}
	}()
}

// wait returns when every queued add is done, with the first error.
func (a *hostAdder) wait() error {
	a.wg.Wait()
	a.last = nil
	a.mu.Lock()
	defer a.mu.Unlock()
	err := a.err
	a.err = nil
	return err
}
