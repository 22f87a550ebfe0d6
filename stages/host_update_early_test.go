package stages

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
)

// TestEarlyUpdate runs the tiny recipe without gradient clipping with the
// actor and its optimizer offloaded, each unit's host AdamW starting as
// its grads reach the host (host_update_early.go), against the same run
// with AdamW started by the optimizer op and against the run on the
// device: the same updates (grad norms, losses, metrics of three steps,
// each from the previous one's weights), bit for bit. Updates of one
// micro-batch on one and two ranks, of several on one rank (the last
// micro-batch's grads added in by the host's cores), with and without the
// tied rows (tied_rows.go).
func TestEarlyUpdate(t *testing.T) {
	testEarlyUpdate(t, RunOptions{}, true, 1, 2)
	// Without the tied rows, the embedding's grads reach the host through
	// the host's adds (hostAdder), as on two ranks: its AdamW must wait
	// for them.
	defer func(v bool) { tiedRowsOn = v }(tiedRowsOn)
	tiedRowsOn = false
	testEarlyUpdate(t, RunOptions{}, true, 1)
}

// testEarlyUpdate runs TestEarlyUpdate on base's backend at each of dps
// ranks (loopback on the CPU), against the resident run if resident is
// set.
func testEarlyUpdate(t *testing.T, base RunOptions, resident bool, dps ...int) {
	const steps = 3
	edits := []string{"  max_tokens_per_gpu: 768\n", "  max_tokens_per_gpu: 4096\n", "  steps: 2\n", "  steps: 3\n",
		"  grad_clip: 1.0\n", "  grad_clip: 0\n"}
	offload := []string{"  recompute: 'layer.index % 2 == 0'\n",
		"  recompute: 'layer.index % 2 == 0'\n  offload: 'model.trainable'\n  offload_optimizer: 'model.trainable'\n"}
	run := func(off, early bool, dp int) ([]StepResult, int) {
		defer func(v bool) { earlyOn, earlyStarted = v, nil }(earlyOn)
		var mu sync.Mutex
		started := 0
		earlyOn = early
		earlyStarted = func() {
			mu.Lock()
			started++
			mu.Unlock()
		}
		e := edits
		if off {
			e = append(append([]string(nil), edits...), offload...)
		}
		sp := tinyVariant(t, e...)
		sp.Mesh.GPUsPerNode, sp.Mesh.DP = dp, dp
		if sp.Train.GradClip != 0 {
			t.Fatalf("grad_clip %v: the test checks nothing", sp.Train.GradClip)
		}
		out := runParsed(t, sp, nil, nil, RunOptions{Backend: base.Backend, Comms: base.Comms})
		if len(out.steps) != steps {
			t.Fatalf("%d steps, want %d", len(out.steps), steps)
		}
		return out.steps, started
	}
	for _, c := range []struct {
		tokens string // max_tokens_per_gpu
		dps    []int
	}{
		{"  max_tokens_per_gpu: 4096\n", dps},    // one micro-batch an update
		{"  max_tokens_per_gpu: 768\n", dps[:1]}, // several: the last one's host adds
	} {
		edits[1] = c.tokens
		testEarlyRuns(t, run, resident, c.dps)
	}
}

// testEarlyRuns is testEarlyUpdate's comparisons at each of dps ranks.
func testEarlyRuns(t *testing.T, run func(off, early bool, dp int) ([]StepResult, int), resident bool, dps []int) {
	for _, dp := range dps {
		early, started := run(true, true, dp)
		updates := 0
		for _, sr := range early {
			updates += len(sr.Stats.Updates)
		}
		if updates == 0 || started != dp*updates {
			t.Errorf("dp %d: %d early updates started over %d updates", dp, started, updates)
		}
		late, n := run(true, false, dp)
		if n != 0 {
			t.Errorf("dp %d: %d early updates started with the switch off", dp, n)
		}
		sameUpdates(t, fmt.Sprintf("dp %d: AdamW started early and by the optimizer op", dp), early, late)
		if resident {
			dev, n := run(false, true, dp)
			if n != 0 {
				t.Errorf("dp %d: %d early updates started on the device", dp, n)
			}
			sameUpdates(t, fmt.Sprintf("dp %d: offloaded with AdamW started early, and on the device", dp), early, dev)
		}
	}
}

// fakeEvent is a gpu.Event that completes when done closes; Sync closes
// reached (when set) first, to tell the test that the waiter got to it.
type fakeEvent struct{ done, reached chan struct{} }

func (e fakeEvent) Sync() error {
	if e.reached != nil {
		close(e.reached)
	}
	<-e.done
	return nil
}
func (e fakeEvent) Close() error { return nil }

// TestHostUpdateAsArrived drives the early updater by hand: a unit is
// updated only once its event completes; of the units that have arrived
// the lowest goes first; a unit that never arrives fails the update,
// whose other units are still released.
func TestHostUpdateAsArrived(t *testing.T) {
	st := &ShardState{}
	for k := range 6 {
		st.Units = append(st.Units, &Unit{ord: k})
		st.Units[k].Name = "u" + string(rune('0'+k))
	}
	r := &Rank{}
	var mu sync.Mutex
	var order []int
	gate := make(chan struct{})
	evs := make(chan arrived, 6)
	h := r.startHostUpdateAsArrived(t.Context(), st, evs, func(u *Unit) error {
		if u.ord == 4 {
			<-gate // hold the first update while 3, 1 and 2 arrive
		}
		mu.Lock()
		order = append(order, u.ord)
		mu.Unlock()
		return nil
	})
	ev := func(ord int, reached chan struct{}) fakeEvent {
		e := fakeEvent{done: make(chan struct{}), reached: reached}
		evs <- arrived{ord: ord, ev: e}
		return e
	}
	close(ev(4, nil).done)
	pending := ev(3, nil) // recorded, not complete: 3 must wait
	select {
	case <-h.done[3]:
		t.Fatal("unit 3 updated before its grads arrived")
	case <-time.After(20 * time.Millisecond):
	}
	close(pending.done)
	close(ev(1, nil).done)
	close(ev(2, nil).done)
	// The waiter takes events in order: once it waits for unit 5's, 3, 1
	// and 2 have arrived.
	reached := make(chan struct{})
	last := ev(5, reached)
	<-reached
	close(gate)
	<-h.done[3]
	close(last.done)
	<-h.done[5]
	close(evs) // unit 0 never arrives
	<-h.all
	if want := []int{4, 1, 2, 3, 5}; !reflect.DeepEqual(order, want) {
		t.Errorf("update order %v, want %v", order, want)
	}
	if h.err == nil || !strings.Contains(h.err.Error(), "u0") || !strings.Contains(h.err.Error(), "never reached") {
		t.Errorf("error %v, want u0's grads never reached the host", h.err)
	}
	if h.updated[0] || !h.updated[1] || !h.updated[5] {
		t.Errorf("updated %v", h.updated)
	}
	r.bg.Wait()
}

// TestEarlyUpdateFails cuts an early update's backward short: the
// staging of the third unit's grads fails. The run returns that error
// (not a hang waiting for grads that never come, nor the updater's own
// error in its place).
func TestEarlyUpdateFails(t *testing.T) {
	defer func(v bool) { earlyOn, stagingHook, earlyStarted = v, nil, nil }(earlyOn)
	earlyOn = true
	var mu sync.Mutex
	calls, started := 0, 0
	earlyStarted = func() {
		mu.Lock()
		started++
		mu.Unlock()
	}
	stagingHook = func(gpu.Backend, gpu.Tensor) error {
		mu.Lock()
		defer mu.Unlock()
		if calls++; calls == 3 {
			return errors.New("staging refused by the test")
		}
		return nil
	}
	sp := tinyVariant(t, "  max_tokens_per_gpu: 768\n", "  max_tokens_per_gpu: 4096\n", "  grad_clip: 1.0\n", "  grad_clip: 0\n",
		"  recompute: 'layer.index % 2 == 0'\n",
		"  recompute: 'layer.index % 2 == 0'\n  offload: 'model.trainable'\n  offload_optimizer: 'model.trainable'\n")
	sp.Mesh.GPUsPerNode, sp.Mesh.DP = 1, 1
	j := resolveSpec(t, sp)
	p, err := Plan(j)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := Run(context.Background(), j, p, RunOptions{})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "staging refused by the test") {
			t.Errorf("run error %v, want the staging's", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the run hung after its backward failed")
	}
	if calls < 3 || started == 0 {
		t.Fatalf("%d stagings, %d early updates: the failure was not injected into one", calls, started)
	}
}
