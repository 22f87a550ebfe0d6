package jobs

import (
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Resume prepares an opened run to continue: it takes the run's lock
// (ErrLocked if another process holds it), finds the latest committed
// checkpoint, drops the lines of metrics.jsonl and updates.jsonl after
// that step (all of them when there is no checkpoint; see
// TruncateMetricsAfter), forgets an export made from a later step (its
// weights are being discarded) and records the run as running again,
// counting the resume. Training continues at step+1 from the weights in
// dir; ok is false when there is no committed checkpoint and training
// starts over at step 1. When step is already TotalSteps, training is
// complete and only the export may be missing (see PendingExport). Any
// run that has not succeeded can be resumed, an interrupted one included;
// a run that already succeeded is refused with ErrAlreadySucceeded.
func (r *Run) Resume() (step int, dir string, ok bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.meta.Status == StatusSucceeded {
		return 0, "", false, fmt.Errorf("resume %s: %w", r.meta.ID, ErrAlreadySucceeded)
	}
	if r.lock == nil {
		lock, err := lockFile(filepath.Join(r.dir, lockFileName))
		if err != nil {
			return 0, "", false, fmt.Errorf("resume %s: %w", r.meta.ID, err)
		}
		r.lock = lock
	}
	step, dir, ok, err = r.latestCheckpointLocked()
	if err != nil {
		return 0, "", false, fmt.Errorf("resume %s: %w", r.meta.ID, err)
	}
	if err := r.truncateMetricsLocked(step); err != nil {
		return 0, "", false, fmt.Errorf("resume %s: %w", r.meta.ID, err)
	}
	prev := r.meta
	r.meta.Status = StatusRunning
	r.meta.Error = ""
	r.meta.Finished = time.Time{}
	r.meta.Resumes++
	if r.meta.ExportedStep > step {
		r.meta.Exported, r.meta.ExportedStep = "", 0
	}
	r.meta.PID = os.Getpid()
	if h, err := os.Hostname(); err == nil {
		r.meta.Host = h
	}
	if err := r.writeMetaLocked(); err != nil {
		r.meta = prev
		return 0, "", false, fmt.Errorf("resume %s: %w", r.meta.ID, err)
	}
	return step, dir, ok, nil
}

// PendingExport reports whether the run's training finished but its export
// did not: the run has not succeeded, its latest committed checkpoint is
// at step TotalSteps (> 0), and the record names no export made from that
// step (Exported empty, or ExportedStep another step). step and dir are
// that checkpoint, for the caller to export from; they are returned
// whenever the checkpoint is at TotalSteps, even when pending is false
// because Exported already holds that step's export and only the final
// status is missing. It reads the record and takes no lock, so it works
// on a run from Open before Resume; a caller that then writes to the run
// should Resume it first. A damaged latest checkpoint is an error
// wrapping ErrCorruptCheckpoint.
func (r *Run) PendingExport() (step int, dir string, pending bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.meta
	if m.TotalSteps <= 0 {
		return 0, "", false, nil
	}
	step, dir, ok, err := r.latestCheckpointLocked()
	if err != nil {
		return 0, "", false, fmt.Errorf("pending export %s: %w", m.ID, err)
	}
	if !ok || step != m.TotalSteps {
		return 0, "", false, nil
	}
	done := m.Status == StatusSucceeded || (m.Exported != "" && m.ExportedStep == step)
	return step, dir, !done, nil
}

// SetVersion records the rlpipe version now running the run, for example
// after a resume with a newer binary.
func (r *Run) SetVersion(v string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.meta
	r.meta.Version = v
	if err := r.writeMetaLocked(); err != nil {
		r.meta = prev
		return err
	}
	return nil
}
