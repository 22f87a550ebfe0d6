package cli

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/jobs"
	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/stages"
	"github.com/rs/zerolog"
)

// checkpointPath is the directory of the checkpoint of step in run
// directory dir.
func checkpointPath(dir string, step int) string {
	return filepath.Join(dir, jobs.CheckpointsDir, fmt.Sprintf("step-%d", step))
}

// saver writes the ranks' checkpoints. Without train.checkpoint_async
// every rank writes its shards at the step's end and rank 0 commits the
// checkpoint once all have (checkpoint). With it, the ranks copy their
// shards into their pinned snapshots, which is all the step waits for,
// and write the files in the background; at each later step's end the
// ranks agree whether every write has finished, and rank 0 then commits.
// A snapshot waits for the previous checkpoint's writes, and the run's
// last step waits for its own, so the run ends with its last checkpoint
// committed. A checkpoint is committed only once every rank's file is
// synced and in place: a crash before leaves the previous one.
type saver struct {
	async   bool      // train.checkpoint_async
	rec     *jobs.Run // rank 0's record (nil on the other processes)
	runDir  string
	log     zerolog.Logger
	mu      sync.Mutex
	pending map[int]*pendingSave // by rank
}

// pendingSave is a rank's checkpoint being written in the background.
type pendingSave struct {
	step  int
	start time.Time
	done  chan struct{}
	err   error
}

// afterStep runs at the end of rank r's step: it settles the rank's
// background write, and saves a checkpoint when save is set. final is the
// run's last step (or a stop), after which nothing may be left pending.
func (s *saver) afterStep(ctx context.Context, r *stages.Rank, step int, save, final bool) error {
	if !s.async {
		if !save {
			return nil
		}
		t0 := time.Now()
		if err := checkpoint(ctx, s.rec, s.runDir, r, step); err != nil {
			return err
		}
		if r.ID == 0 {
			s.log.Info().Str("event", "checkpoint_saved").Int("step", step).Float64("seconds", time.Since(t0).Seconds()).Str("dir", checkpointPath(s.runDir, step)).Msg("checkpoint saved")
		}
		return nil
	}
	if err := s.settle(ctx, r, save || final); err != nil {
		return err
	}
	if !save {
		return nil
	}
	t0 := time.Now()
	dir, err := prepareCheckpoint(ctx, s.rec, s.runDir, r, step)
	if err != nil {
		return err
	}
	if err := r.Snapshot(); err != nil {
		return fmt.Errorf("checkpoint of step %d: %w", step, err)
	}
	p := &pendingSave{step: step, start: time.Now(), done: make(chan struct{})}
	s.mu.Lock()
	s.pending[r.ID] = p
	s.mu.Unlock()
	r.Background(func() {
		defer close(p.done)
		p.err = r.SaveSnapshot(dir)
	})
	if r.ID == 0 {
		s.log.Info().Str("event", "checkpoint_snapshot").Int("step", step).Float64("seconds", time.Since(t0).Seconds()).Msg("checkpoint snapshot taken")
	}
	if final {
		return s.settle(ctx, r, true)
	}
	return nil
}

// settle asks every rank whether its background write has finished (wait:
// after waiting for it), and when all have, rank 0 commits the checkpoint.
// Every rank calls it at the same steps (all save at the same steps), so
// the agreement is a collective over the control communicator.
func (s *saver) settle(ctx context.Context, r *stages.Rank, wait bool) error {
	s.mu.Lock()
	p := s.pending[r.ID]
	s.mu.Unlock()
	if p == nil {
		return nil
	}
	if wait {
		select {
		case <-p.done:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	// [unfinished, failed] summed over the ranks.
	state := nccl.Bytes(make([]byte, 8))
	flags := gpu.Tensor{Mem: state, DType: gpu.F32, Shape: []int{2}}
	var werr error // the write's error, read only once it has finished
	select {
	case <-p.done:
		if werr = p.err; werr != nil {
			putF32(state[4:], 1)
		}
	default:
		putF32(state, 1)
	}
	if err := r.Control.AllReduce(ctx, flags, nccl.Sum); err != nil {
		return err
	}
	unfinished, failed := getF32(state), getF32(state[4:])
	switch {
	case werr != nil:
		return fmt.Errorf("checkpoint of step %d: %w", p.step, werr)
	case failed > 0:
		return fmt.Errorf("checkpoint of step %d: %g rank(s) could not write their shards", p.step, failed)
	case unfinished > 0:
		return nil // still writing: asked again after the next step
	}
	s.mu.Lock()
	delete(s.pending, r.ID)
	s.mu.Unlock()
	if r.ID != 0 {
		return nil
	}
	if err := s.rec.CommitCheckpoint(p.step); err != nil {
		return err
	}
	s.log.Info().Str("event", "checkpoint_saved").Int("step", p.step).Float64("seconds", time.Since(p.start).Seconds()).Str("dir", checkpointPath(s.runDir, p.step)).Msg("checkpoint saved")
	return nil
}

// prepareCheckpoint makes the directory of step's checkpoint (rank 0, in
// the record) and returns it once every rank knows it is there.
func prepareCheckpoint(ctx context.Context, rec *jobs.Run, runDir string, r *stages.Rank, step int) (string, error) {
	dir := checkpointPath(runDir, step)
	if r.ID == 0 {
		d, err := rec.CheckpointDir(step)
		if err != nil {
			return "", err
		}
		dir = d
	}
	return dir, r.Control.Barrier(ctx)
}

// checkpoint saves every rank's shards at step and commits the checkpoint
// once all ranks have written. Rank 0 holds the record (rec); the others
// know only its directory.
func checkpoint(ctx context.Context, rec *jobs.Run, runDir string, r *stages.Rank, step int) error {
	dir, err := prepareCheckpoint(ctx, rec, runDir, r, step)
	if err != nil {
		return err
	}
	if err := r.SaveShards(dir); err != nil {
		return err
	}
	if err := r.Control.Barrier(ctx); err != nil {
		return err
	}
	if r.ID == 0 {
		return rec.CommitCheckpoint(step)
	}
	return nil
}

func putF32(b []byte, v float32) { binary.LittleEndian.PutUint32(b, math.Float32bits(v)) }

func getF32(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }
