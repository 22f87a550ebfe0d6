package jobs

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// commitMarker is the file whose presence makes a checkpoint directory
// complete. It is written last, atomically, after every file in the
// directory has been fsynced.
const commitMarker = ".committed"

// Checkpoint describes a committed checkpoint.
type Checkpoint struct {
	Step      int              `json:"step"`
	Dir       string           `json:"-"`
	Committed time.Time        `json:"committed"`
	Files     []CheckpointFile `json:"files"`
}

// CheckpointFile is one file of a committed checkpoint as seen at commit.
type CheckpointFile struct {
	Path string `json:"path"` // slash-separated, relative to the checkpoint dir
	Size int64  `json:"size"`
}

// Bytes returns the total size of the checkpoint's files.
func (c Checkpoint) Bytes() int64 {
	var n int64
	for _, f := range c.Files {
		n += f.Size
	}
	return n
}

// checkpointDir returns the path of checkpoints/step-N.
func (r *Run) checkpointDir(step int) string {
	return filepath.Join(r.dir, CheckpointsDir, "step-"+strconv.Itoa(step))
}

// CheckpointDir returns the directory for the checkpoint of step, creating
// it, for the caller to write files into. A directory left uncommitted by
// an earlier process is emptied first; calling CheckpointDir again from the
// same Run before CommitCheckpoint returns the same directory untouched.
// A committed checkpoint is never reopened: that is ErrCheckpointExists.
func (r *Run) CheckpointDir(step int) (string, error) {
	if step < 0 {
		return "", fmt.Errorf("checkpoint dir: negative step %d", step)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	dir := r.checkpointDir(step)
	if r.prepared[step] {
		return dir, nil
	}
	if _, err := os.Stat(filepath.Join(dir, commitMarker)); err == nil {
		return "", fmt.Errorf("checkpoint step %d: %w", step, ErrCheckpointExists)
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("checkpoint dir: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("checkpoint dir: clear stale: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("checkpoint dir: %w", err)
	}
	if err := syncDir(filepath.Dir(dir)); err != nil {
		return "", fmt.Errorf("checkpoint dir: %w", err)
	}
	if r.prepared == nil {
		r.prepared = make(map[int]bool)
	}
	r.prepared[step] = true
	return dir, nil
}

// CommitCheckpoint marks the checkpoint of step complete: it fsyncs every
// file and directory under it, then atomically writes the marker listing
// the files and their sizes. Until it returns nil the checkpoint is not
// reported by LatestCheckpoint. Committing an already committed
// checkpoint does nothing.
func (r *Run) CommitCheckpoint(step int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	dir := r.checkpointDir(step)
	if _, err := os.Stat(filepath.Join(dir, commitMarker)); err == nil {
		delete(r.prepared, step)
		return nil
	}
	st, err := os.Stat(dir)
	if err != nil || !st.IsDir() {
		return fmt.Errorf("commit checkpoint step %d: %w", step, ErrNoCheckpoint)
	}
	c := Checkpoint{Step: step, Files: []CheckpointFile{}}
	var dirs []string
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, path)
			return nil
		}
		if rel == commitMarker || strings.HasPrefix(rel, "."+commitMarker) {
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file", rel)
		}
		if err := syncFile(path); err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		c.Files = append(c.Files, CheckpointFile{Path: filepath.ToSlash(rel), Size: info.Size()})
		return nil
	})
	if err != nil {
		return fmt.Errorf("commit checkpoint step %d: %w", step, err)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := syncDir(dirs[i]); err != nil {
			return fmt.Errorf("commit checkpoint step %d: %w", step, err)
		}
	}
	c.Committed = r.now().UTC()
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("commit checkpoint step %d: %w", step, err)
	}
	if err := writeFileAtomic(filepath.Join(dir, commitMarker), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("commit checkpoint step %d: %w", step, err)
	}
	delete(r.prepared, step)
	return nil
}

// checkpointSteps lists the steps that have a step-N directory, highest
// first, ignoring other entries.
func (r *Run) checkpointSteps() ([]int, error) {
	entries, err := os.ReadDir(filepath.Join(r.dir, CheckpointsDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	var steps []int
	for _, e := range entries {
		s, ok := strings.CutPrefix(e.Name(), "step-")
		if !ok || !e.IsDir() {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || strconv.Itoa(n) != s {
			continue
		}
		steps = append(steps, n)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(steps)))
	return steps, nil
}

// loadCheckpoint reads the marker of step and checks that the files it
// lists are present with their recorded sizes. ok is false when the
// directory has no marker.
func (r *Run) loadCheckpoint(step int) (c Checkpoint, ok bool, err error) {
	dir := r.checkpointDir(step)
	data, err := os.ReadFile(filepath.Join(dir, commitMarker))
	if errors.Is(err, os.ErrNotExist) {
		return Checkpoint{}, false, nil
	}
	if err != nil {
		return Checkpoint{}, false, fmt.Errorf("checkpoint step %d: %w", step, err)
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return Checkpoint{}, false, fmt.Errorf("checkpoint step %d: marker: %v: %w", step, err, ErrCorruptCheckpoint)
	}
	if c.Step != step {
		return Checkpoint{}, false, fmt.Errorf("checkpoint step %d: marker names step %d: %w", step, c.Step, ErrCorruptCheckpoint)
	}
	for _, f := range c.Files {
		st, err := os.Stat(filepath.Join(dir, filepath.FromSlash(f.Path)))
		if err != nil {
			return Checkpoint{}, false, fmt.Errorf("checkpoint step %d: %s: %v: %w", step, f.Path, err, ErrCorruptCheckpoint)
		}
		if st.Size() != f.Size {
			return Checkpoint{}, false, fmt.Errorf("checkpoint step %d: %s is %d bytes, committed %d: %w",
				step, f.Path, st.Size(), f.Size, ErrCorruptCheckpoint)
		}
	}
	c.Dir = dir
	return c, true, nil
}

// LatestCheckpoint returns the step and directory of the newest committed
// checkpoint; ok is false when there is none. Uncommitted directories are
// skipped. A committed checkpoint whose files no longer match its marker
// is an error wrapping ErrCorruptCheckpoint rather than silently skipped.
func (r *Run) LatestCheckpoint() (step int, dir string, ok bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.latestCheckpointLocked()
}

func (r *Run) latestCheckpointLocked() (int, string, bool, error) {
	steps, err := r.checkpointSteps()
	if err != nil {
		return 0, "", false, err
	}
	for _, s := range steps {
		c, ok, err := r.loadCheckpoint(s)
		if err != nil {
			return 0, "", false, err
		}
		if ok {
			return c.Step, c.Dir, true, nil
		}
	}
	return 0, "", false, nil
}

// Checkpoints returns every committed checkpoint, lowest step first.
func (r *Run) Checkpoints() ([]Checkpoint, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	steps, err := r.checkpointSteps()
	if err != nil {
		return nil, err
	}
	var cs []Checkpoint
	for i := len(steps) - 1; i >= 0; i-- {
		c, ok, err := r.loadCheckpoint(steps[i])
		if err != nil {
			return nil, err
		}
		if ok {
			cs = append(cs, c)
		}
	}
	return cs, nil
}

// RemoveCheckpoint deletes the checkpoint of step, committed or not. The
// marker goes first, so a crash midway leaves an uncommitted directory,
// never a committed one with files missing.
func (r *Run) RemoveCheckpoint(step int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	dir := r.checkpointDir(step)
	if err := os.Remove(filepath.Join(dir, commitMarker)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove checkpoint step %d: %w", step, err)
	}
	if err := syncDir(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove checkpoint step %d: %w", step, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove checkpoint step %d: %w", step, err)
	}
	delete(r.prepared, step)
	return nil
}
