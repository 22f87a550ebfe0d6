package stages

import (
	"regexp"
	"strings"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/stages/rl"
	"github.com/rlpipe/rlpipe/stages/rollout"
)

// Rank is one rank's run-time state: its backend, communicator and arena,
// the sharded models, and the data of the current step.
type Rank struct {
	ID    int
	Comm  nccl.Comm
	B     gpu.Backend
	Arena *Arena
	Step  int // 1-based training step; 0 during setup

	// Side is the stream units are gathered on, so that gathering the next
	// unit overlaps computing this one (nil: everything on the default stream).
	Side gpu.Stream
	// Host is a CPU backend for work on this rank's host memory: with the
	// master params and the optimizer state both offloaded, the optimizer
	// step runs on it, where that memory is, as a CPU-offload trainer does.
	Host gpu.Backend

	Shards map[string]*ShardState
	// Micro holds this step's packed micro-batches of this rank (set by pack).
	Micro []*rollout.Packed
	// Advantages holds r̂ of every sample of the step by its index in the
	// rollout file (set by pack).
	Advantages map[int]float64
	// LogP holds per-token log-probs by stage id and micro-batch.
	LogP map[string][][]float32
	// Entropy holds per-token entropies of the log-prob stages that compute
	// them (entropy: true), by stage id and micro-batch.
	Entropy map[string][][]float32
	// Metrics accumulates this step's loss metrics over micro-batches.
	Metrics rl.Metrics
	// Stats holds the step's scalar results of the train stage.
	Stats StepStats

	data    *Data
	advLogP float64

	// Profile, when not nil, accumulates the wall time of each kind of op
	// (the op name without its layer index: "attention backward", "gather", "embed forward"), with
	// the backend synchronised at every op boundary. RunOptions.Profile
	// turns it on; it costs the overlap of consecutive ops.
	Profile  map[string]time.Duration
	profOp   string
	profLast time.Time
}

// unitName matches the unit in an op name.
var unitName = regexp.MustCompile(`\blayer\d+\b ?`)

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
		r.Profile[strings.TrimSpace(unitName.ReplaceAllString(r.profOp, ""))] += now.Sub(r.profLast)
	}
	r.profOp, r.profLast = next, now
	return nil
}

// StepStats are the train stage's per-step results on a rank (identical on
// every rank after the reductions).
type StepStats struct {
	GradNorm float64
	LR       float64
	Tokens   int64              // tokens over all ranks
	Values   map[string]float64 // loss metrics ÷ GBS, summed over ranks
}

// Data is the rollout data shared by every rank of an in-process job.
type Data struct {
	Samples []rollout.Sample
	Batches [][]int // sample indices of each optimizer step of one pass
}

func newRank(id int, comm nccl.Comm, b gpu.Backend, a *Arena, d *Data) *Rank {
	return &Rank{ID: id, Comm: comm, B: b, Arena: a, Shards: map[string]*ShardState{}, LogP: map[string][][]float32{}, Entropy: map[string][][]float32{}, data: d}
}
