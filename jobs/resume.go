package jobs

import (
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Resume prepares an opened run to continue: it takes the run's lock
// (ErrLocked if another process holds it), finds the latest committed
// checkpoint, drops metric lines after that step (all of them when there
// is no checkpoint) and records the run as running again, counting the
// resume. Training continues at step+1 from the weights in dir; ok is false
// when there is no committed checkpoint and training starts over at step 1.
// A run that already succeeded is refused with ErrAlreadySucceeded.
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
