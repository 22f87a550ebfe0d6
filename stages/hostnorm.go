package stages

import (
	"os"
	"sync"

	"github.com/rlpipe/rlpipe/gpu"
)

// hostNorms sums the squares of offloaded (host) grad shards on the host's
// cores while the device goes on with the backward, so that the optimizer
// op, which needs the global grad norm before any AdamW, finds most of the
// units' sums ready instead of reading every grad after the backward.
//
// A unit's sum is queued by the update's last micro-batch once its own
// reduction has written its shard: after the Down stream's copies (an
// event) and the host adds queued so far (the adder's last add). Backward
// reduces units from the last to the first, and a tied slot's other unit
// (the head) writes its owner's shard (the embedding) before the owner's
// own reduction, so that reduction is the shard's last write. A shard
// written after its sum was queued is marked stale, and the optimizer op
// sums it itself. Sums run one at a time in queue order.
type hostNorms struct {
	host   gpu.Backend
	sumsq  []float64 // by unit ordinal; written by the worker before done[u] is set
	done   []bool
	queued []bool // by the rank's goroutine
	stale  []bool // by the rank's goroutine
	last   chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	err    error
}

// backgroundNorms turns hostNorms on: RLPIPE_HOST_NORMS=1, or tests. It is
// off by default because on the H100 machines measured so far the sums,
// reading host memory while the backward's transfers cross PCIe both ways,
// slowed those transfers by more than they saved in the optimizer op
// (docs/performance.md). normsServed, when set (by tests), is told how
// many units' sums each host optimizer update took from hostNorms.
var (
	backgroundNorms = os.Getenv("RLPIPE_HOST_NORMS") == "1"
	normsServed     func(n int)
)

// normThreads is the host threads the backward's sums of squares use, of
// a rank's threads: a quarter, so that they leave the host's memory
// bandwidth to the transfers they run beside. They have the whole
// backward to finish in.
func normThreads(threads int) int { return max(1, threads/4) }

func newHostNorms(host gpu.Backend, units int) *hostNorms {
	return &hostNorms{host: host, sumsq: make([]float64, units), done: make([]bool, units),
		queued: make([]bool, units), stale: make([]bool, units)}
}

// wrote records that unit ord's shard was written (or is about to be):
// a sum queued before is stale.
func (h *hostNorms) wrote(ord int) {
	if h.queued[ord] {
		h.stale[ord] = true
	}
}

// queue sums the squares of g, unit ord's grad shard, once ev has
// completed (it closes ev) and after (when not nil) is closed.
func (h *hostNorms) queue(ord int, g gpu.Tensor, ev gpu.Event, after <-chan struct{}) {
	h.queued[ord] = true
	prev, done := h.last, make(chan struct{})
	h.last = done
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer close(done)
		err := ev.Sync()
		ev.Close()
		if after != nil {
			<-after
		}
		if prev != nil {
			<-prev
		}
		var ss float64
		if err == nil {
			ss, err = h.host.SumSquares(g)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if err != nil {
			if h.err == nil {
				h.err = err
			}
			return
		}
		h.sumsq[ord], h.done[ord] = ss, true
	}()
}

// wait returns when every queued sum is done, with the first error.
func (h *hostNorms) wait() error {
	h.wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// sum returns unit ord's sum of squares and whether it is ready and
// current; call it after wait.
func (h *hostNorms) sum(ord int) (float64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sumsq[ord], h.done[ord] && !h.stale[ord]
}
