package stages

import (
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/spec"
)

// StageTime is the wall time of one run of a stage.
type StageTime struct {
	Stage   string  `json:"stage"`
	Seconds float64 `json:"seconds"`
}

// Rank is one rank's run-time state: its backend, communicator and arena,
// and the values the stages wrote (the sharded models among them).
type Rank struct {
	ID   int
	Comm nccl.Comm
	// Control is a host-memory communicator over the same ranks, for what
	// ranks agree on outside the stages: in one process a loopback, across
	// processes TCP.
	Control nccl.Comm
	// CP is the communicator of the rank's context-parallel group (nil
	// when mesh.cp is 1): its rank there is the rank's cp rank, ID mod cp,
	// and Ring passes keys and values round it.
	CP    nccl.Comm
	Ring  model.Ring
	B     gpu.Backend
	Arena *Arena
	Step  int // 1-based training step; 0 during setup
	// bg tracks the rank's background work (Background).
	bg sync.WaitGroup
	// snapped lists the tensors of the last Snapshot, for SaveSnapshot.
	snapped []shardTensor
	// Setup holds the wall time of each setup stage, the device synced at
	// its end, in the order they ran.
	Setup []StageTime
	// setup sends the rank's setup events (RunOptions.Progress; nil: none).
	setup *setupReporter

	// Side is the stream units are gathered on, so that gathering the next
	// unit overlaps computing this one (nil: everything on the default stream).
	Side gpu.Stream
	// Down is the stream grads are copied to the host on when the optimizer
	// state is offloaded, so that they cross PCIe while the backward goes
	// on and the side stream's gathers cross the other way (nil: on the
	// default stream).
	Down gpu.Stream
	// Host is a CPU backend for work on this rank's host memory: with the
	// master params and the optimizer state both offloaded, the optimizer
	// step runs on it, where that memory is, as a CPU-offload trainer does.
	Host gpu.Backend
	// hostBackground is Host for the optimizer step that goes on in the
	// background, with a core fewer.
	hostBackground gpu.Backend
	// syncHostOptimizer makes a host optimizer step finish within its op
	// (RunOptions.SyncHostOptimizer).
	syncHostOptimizer bool

	// values holds the outputs the stages wrote: setup's for the run, the
	// current step's since it started.
	values values
	// Stats holds the step's results of the train stage: one entry per
	// optimizer update and their summary.
	Stats StepStats
	// reports holds the values stages reported this step (RunContext.Report).
	reports map[string]float64

	// Profile, when not nil, accumulates the wall time of each kind of op
	// (the op name without its layer index: "attention backward", "gather", "embed forward"), with
	// the backend synchronised at every op boundary. RunOptions.Profile
	// turns it on; it costs the overlap of consecutive ops.
	Profile  map[string]time.Duration
	profOp   string
	profLast time.Time
	// tl collects the step's timeline (RunOptions.Timeline); nil when off.
	tl *timeline

	// released holds, on rank 0, the engines (by URL) whose memory a wake
	// stage released and no sleep stage has resumed yet. rlpipe assumes an
	// engine holds its memory when the run starts.
	released map[string]bool
	// deviceMemory measures the process's device memory (RunOptions).
	deviceMemory func() (int64, bool)
	// host is the rank's host buffer for loading and checkpoints (scratch).
	host []float32
}

// scratch returns the rank's host buffer of n float32s, grown when needed:
// loading every model and every checkpoint share one, so that the process
// holds the plan's host buffer rather than one per use waiting for the
// garbage collector.
func (r *Rank) scratch(n int) []float32 {
	if cap(r.host) < n {
		r.host = nil // the old one can go before the new one is allocated
		r.host = make([]float32, n)
	}
	return r.host[:n]
}

// Background runs fn in a goroutine that the rank's run waits for before
// it frees the rank's memory: work on the rank's host buffers that goes on
// after the step that started it, such as writing a checkpoint from its
// snapshot.
func (r *Rank) Background(fn func()) {
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		fn()
	}()
}

// dpRank is the rank's data-parallel rank: which share of the batch it
// computes on (with its cp group).
func (r *Rank) dpRank(m spec.Mesh) int { return r.ID / m.CPSize() }

// cpRank is the rank's place in its context-parallel group.
func (r *Rank) cpRank(m spec.Mesh) int { return r.ID % m.CPSize() }

// unitName matches the unit in an op name.
var unitName = regexp.MustCompile(`\blayer\d+\b ?`)

// opKind is an op's name without its layer ("layer3 norm1" → "norm1").
func opKind(op string) string { return strings.TrimSpace(unitName.ReplaceAllString(op, "")) }

// profileOp closes the timing of the current op and opens next's ("" ends
// the stage's last op).
func (r *Rank) profileOp(next string) error {
	if r.Profile == nil {
		return nil
	}
	if err := r.B.Sync(); err != nil {
		return err
	}
	now := time.Now()
	if r.profOp != "" {
		r.Profile[opKind(r.profOp)] += now.Sub(r.profLast)
	}
	r.profOp, r.profLast = next, now
	return nil
}

// timelineOp records, on the compute stream, that it reached op name of
// stage ("" ends the stage's last op), when the timeline is on.
func (r *Rank) timelineOp(stage, name string) error {
	if r.tl == nil {
		return nil
	}
	return r.tl.markStage(r.B.DefaultStream(), markOp, name, stage)
}

// timelineMark records a mark of the step's timeline on s (nil: the
// compute stream) when the timeline is on.
func (r *Rank) timelineMark(s gpu.Stream, kind markKind, name string) error {
	if r.tl == nil {
		return nil
	}
	if s == nil {
		s = r.B.DefaultStream()
	}
	return r.tl.mark(s, kind, name)
}

// UpdateStats are one optimizer update's results on a rank (identical on
// every rank after the reductions).
type UpdateStats struct {
	Index     int // 0-based over the run
	Epoch     int // 1-based within the step
	MiniBatch int // 1-based within the epoch
	GradNorm  float64
	LR        float64
	Tokens    int64              // tokens over all ranks
	Values    map[string]float64 // the loss metrics of the mini-batch, over all ranks
}

// StepStats are a step's results: its updates and their summary, the
// mean over the updates of every value (each update has global_batch_size
// samples, so the mean is weighted by samples) with the tokens summed.
type StepStats struct {
	Updates  []UpdateStats
	GradNorm float64
	LR       float64
	Tokens   int64
	Values   map[string]float64
}

// summarize fills the step's summary from its updates.
func (s *StepStats) summarize() {
	s.GradNorm, s.LR, s.Tokens, s.Values = 0, 0, 0, map[string]float64{}
	n := float64(len(s.Updates))
	for _, u := range s.Updates {
		s.GradNorm += u.GradNorm / n
		s.LR += u.LR / n
		s.Tokens += u.Tokens
		for k, v := range u.Values {
			s.Values[k] += v / n
		}
	}
}

func newRank(id int, comm nccl.Comm, b gpu.Backend, a *Arena) *Rank {
	return &Rank{ID: id, Comm: comm, B: b, Arena: a, values: values{}, reports: map[string]float64{}, released: map[string]bool{}}
}

// shards returns the rank's sharded models by name: the weights the
// apply_fsdp2 stages wrote.
func (r *Rank) shards() map[string]*ShardState {
	out := map[string]*ShardState{}
	for _, v := range r.values {
		if st, ok := v.(*ShardState); ok {
			out[st.Model.Name()] = st
		}
	}
	return out
}

// Output returns the value stage id wrote to its output port this step
// (or during setup), or nil when it wrote none: for callers that look at a
// step's results from RunOptions.AfterStep.
func (r *Rank) Output(id, port string) any { return r.values[id+"."+port] }
