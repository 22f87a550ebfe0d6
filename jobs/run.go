package jobs

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// DefaultRoot is the directory that holds run directories when the caller
// does not name another one.
const DefaultRoot = "runs"

// Names of the files in a run directory.
const (
	MetaFile     = "run.json"
	SpecFile     = "spec.yaml"
	ResolvedFile = "resolved.json"
	PlanFile     = "plan.json"
	MetricsFile  = "metrics.jsonl"
	// UpdatesFile holds one line per optimizer update (see AppendUpdate).
	UpdatesFile = "updates.jsonl"
	// DroppedMetricsFile keeps metric lines removed by TruncateMetricsAfter.
	DroppedMetricsFile = "metrics-dropped.jsonl"
	// DroppedUpdatesFile keeps update lines removed by TruncateMetricsAfter.
	DroppedUpdatesFile = "updates-dropped.jsonl"
	LogFileName        = "log"
	CheckpointsDir     = "checkpoints"
	// TimelineDir holds the traced steps' timelines (run --timeline), one
	// Chrome trace each: TimelineFile(step).
	TimelineDir  = "timeline"
	lockFileName = ".lock"
)

// TimelineFile is the name, in TimelineDir, of step's timeline.
func TimelineFile(step int) string { return fmt.Sprintf("step-%06d.json", step) }

// Status is the state of a run as recorded in run.json.
type Status string

// The statuses a run can have.
const (
	StatusRunning   Status = "running"
	StatusSucceeded Status = "succeeded"
	StatusFailed    Status = "failed"
	StatusCanceled  Status = "canceled"
	// StatusStopped is a run that ended cleanly before its last step, as
	// asked (rlpipe run --steps); it can be resumed.
	StatusStopped Status = "stopped"
	// StatusInterrupted is a run whose process died without recording how
	// it ended (SIGKILL, the OOM killer, a power loss): run.json still
	// says running, but no process holds the run's lock. Open and List
	// report such a run as interrupted without rewriting run.json; the
	// status is stored only if a caller then writes the opened run's
	// metadata. It can be resumed.
	StatusInterrupted Status = "interrupted"
)

// Valid reports whether s is one of the defined statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusRunning, StatusSucceeded, StatusFailed, StatusCanceled, StatusStopped, StatusInterrupted:
		return true
	}
	return false
}

// Errors returned (wrapped) by this package; test for them with errors.Is.
var (
	ErrNotFound          = errors.New("run not found")
	ErrAmbiguous         = errors.New("ambiguous run id")
	ErrLocked            = errors.New("run is in use by another process")
	ErrReservedName      = errors.New("reserved file name")
	ErrBadStatus         = errors.New("invalid status")
	ErrTruncatedMetrics  = errors.New("truncated metrics line ignored")
	ErrCheckpointExists  = errors.New("checkpoint already committed")
	ErrNoCheckpoint      = errors.New("no such checkpoint")
	ErrCorruptCheckpoint = errors.New("committed checkpoint is damaged")
	ErrAlreadySucceeded  = errors.New("run already succeeded")
)

// Meta is the content of run.json.
type Meta struct {
	// ID is the full run uuid.
	ID string `json:"id"`
	// Name is a human label, usually the job name from the spec.
	Name string `json:"name,omitempty"`
	// SpecPath is the path of the spec file the run was started from, as
	// the caller gave it.
	SpecPath string `json:"spec_path,omitempty"`
	// SpecDir is the absolute directory that the spec's relative paths
	// (data files, models) resolve against. With it, a run can be resumed
	// from any working directory using the record's own copy of the spec
	// (spec.yaml).
	SpecDir string `json:"spec_dir,omitempty"`
	// Seed is the seed of the run's random choices.
	Seed int64 `json:"seed"`
	// Created is when the run directory was made.
	Created time.Time `json:"created"`
	// Updated is when run.json was last written.
	Updated time.Time `json:"updated"`
	// Finished is when the run last left the running status. It stays
	// zero for an interrupted run, whose end was never recorded; Updated
	// then bounds the last time its process wrote run.json.
	Finished time.Time `json:"finished,omitzero"`
	// Status is one of the Status constants. Open and List report a run
	// stored as running whose lock no process holds as interrupted.
	Status Status `json:"status"`
	// Error is the message of the error that failed or canceled the run.
	Error string `json:"error,omitempty"`
	// LastStep is the highest step recorded in metrics.jsonl, 0 for none.
	LastStep int `json:"last_step"`
	// TotalSteps is the number of steps the run is meant to take.
	TotalSteps int `json:"total_steps"`
	// Host is the host name of the machine that last ran the run.
	Host string `json:"host,omitempty"`
	// PID is the process id that last ran the run.
	PID int `json:"pid,omitempty"`
	// Version is the rlpipe version string that last ran the run.
	Version string `json:"version,omitempty"`
	// Resumes counts how many times the run was resumed.
	Resumes int `json:"resumes,omitempty"`
	// Exported is the absolute directory of the HF export once it has
	// been written (see SetExported); empty while there is none.
	Exported string `json:"exported,omitempty"`
	// ExportedStep is the step whose weights Exported holds: the run's
	// LastStep when SetExported was called.
	ExportedStep int `json:"exported_step,omitempty"`

	// Dir is the run directory; it is filled in when the run is loaded
	// and is not stored.
	Dir string `json:"-"`
}

// AmbiguousError is returned by Open when a prefix matches several runs.
// It matches ErrAmbiguous under errors.Is.
type AmbiguousError struct {
	Query      string
	Candidates []string // directory names, sorted
}

// Error lists the candidates.
func (e *AmbiguousError) Error() string {
	return fmt.Sprintf("ambiguous run id %q matches %d runs: %s",
		e.Query, len(e.Candidates), strings.Join(e.Candidates, ", "))
}

// Is reports whether target is ErrAmbiguous.
func (e *AmbiguousError) Is(target error) bool { return target == ErrAmbiguous }

// BrokenRunError describes a directory under the root that List could not
// read as a run.
type BrokenRunError struct {
	Dir string
	Err error
}

// Error names the directory and the cause.
func (e *BrokenRunError) Error() string { return fmt.Sprintf("run %s: %v", e.Dir, e.Err) }

// Unwrap returns the cause.
func (e *BrokenRunError) Unwrap() error { return e.Err }

// Run is an open run directory. Its methods are safe for concurrent use.
// Close releases the lock taken by Create or Resume.
type Run struct {
	mu          sync.Mutex
	dir         string
	meta        Meta
	lock        *os.File
	tailChecked bool         // metrics.jsonl ends with a newline
	updChecked  bool         // updates.jsonl ends with a newline
	prepared    map[int]bool // checkpoint dirs made by this Run
	now         func() time.Time
}

// dirNameRE matches the names Create gives run directories.
var dirNameRE = regexp.MustCompile(`^[0-9]{8}-[0-9]{6}-[0-9a-f]{8}$`)

// Create makes a new run directory under root (created if missing), writes
// run.json with status running and returns the run, locked against a
// concurrent Resume until Close. From m it keeps Name, SpecPath, SpecDir
// (made absolute against the working directory when relative), Seed,
// TotalSteps, Version and Host (the local host name when empty); it sets
// the id, times, status, PID and Dir itself and clears the rest.
func Create(root string, m Meta) (*Run, error) {
	return create(root, m, time.Now, uuid.New)
}

func create(root string, m Meta, now func() time.Time, newID func() uuid.UUID) (*Run, error) {
	if root == "" {
		root = DefaultRoot
	}
	if m.SpecDir != "" {
		abs, err := filepath.Abs(m.SpecDir)
		if err != nil {
			return nil, fmt.Errorf("create run: spec dir: %w", err)
		}
		m.SpecDir = abs
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("create run: %w", err)
	}
	t := now().UTC()
	var (
		id  uuid.UUID
		dir string
	)
	for attempt := 0; ; attempt++ {
		id = newID()
		dir = filepath.Join(root, t.Format("20060102-150405")+"-"+id.String()[:8])
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrExist) || attempt >= 9 {
			return nil, fmt.Errorf("create run: %w", err)
		}
	}
	if m.Host == "" {
		m.Host, _ = os.Hostname()
	}
	m.ID = id.String()
	m.Created, m.Updated, m.Finished = t, t, time.Time{}
	m.Status, m.Error = StatusRunning, ""
	m.LastStep, m.Resumes = 0, 0
	m.Exported, m.ExportedStep = "", 0
	m.PID = os.Getpid()
	m.Dir = dir
	r := &Run{dir: dir, meta: m, now: now}
	fail := func(err error) (*Run, error) {
		r.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("create run: %w", err)
	}
	lock, err := lockFile(filepath.Join(dir, lockFileName))
	if err != nil {
		return fail(err)
	}
	r.lock = lock
	if err := os.Mkdir(filepath.Join(dir, CheckpointsDir), 0o755); err != nil {
		return fail(err)
	}
	if err := r.writeMetaLocked(); err != nil {
		return fail(err)
	}
	if err := syncDir(root); err != nil {
		return fail(err)
	}
	return r, nil
}

// Open opens an existing run under root. idOrPrefix may be the full uuid,
// a prefix of it (for example the 8 characters in the directory name), or
// the directory name or a prefix of it. An exact match of a full id or
// directory name wins over prefix matches; several prefix matches give an
// *AmbiguousError. The returned run is not locked. A run stored as running
// whose lock no process holds is reported as interrupted in its Meta (see
// StatusInterrupted); run.json is left as it is.
func Open(root, idOrPrefix string) (*Run, error) {
	if root == "" {
		root = DefaultRoot
	}
	q := strings.ToLower(strings.TrimSpace(idOrPrefix))
	q = strings.TrimSuffix(q, "/")
	if q == "" {
		return nil, fmt.Errorf("open run: empty id: %w", ErrNotFound)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("open run %q: %w", idOrPrefix, ErrNotFound)
		}
		return nil, fmt.Errorf("open run: %w", err)
	}
	var exact, prefix []string
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || strings.HasPrefix(name, ".") {
			continue
		}
		id := ""
		if m, err := readMeta(filepath.Join(root, name)); err == nil {
			id = strings.ToLower(m.ID)
		} else if dirNameRE.MatchString(name) {
			id = name[len(name)-8:] // best effort for a broken run
		}
		switch {
		case name == q || id == q:
			exact = append(exact, name)
		case strings.HasPrefix(name, q) || (id != "" && strings.HasPrefix(id, q)):
			prefix = append(prefix, name)
		}
	}
	matches := exact
	if len(matches) == 0 {
		matches = prefix
	}
	switch len(matches) {
	case 0:
		return nil, fmt.Errorf("open run %q in %s: %w", idOrPrefix, root, ErrNotFound)
	case 1:
	default:
		sort.Strings(matches)
		return nil, &AmbiguousError{Query: idOrPrefix, Candidates: matches}
	}
	dir := filepath.Join(root, matches[0])
	m, err := readMeta(dir)
	if err != nil {
		return nil, fmt.Errorf("open run %s: %w", matches[0], err)
	}
	observeStatus(&m)
	return &Run{dir: dir, meta: m, now: time.Now}, nil
}

// List returns the metadata of every run under root, newest first. A
// missing root holds no runs. Directories that cannot be read as runs are
// skipped; List then returns the readable runs together with an error
// joining one *BrokenRunError per skipped directory, so callers can print
// the runs and warn about the rest. Runs stored as running whose lock no
// process holds are listed as interrupted (see StatusInterrupted).
func List(root string) ([]Meta, error) {
	if root == "" {
		root = DefaultRoot
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("list runs: %w", err)
	}
	var (
		metas  []Meta
		broken []error
	)
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || strings.HasPrefix(name, ".") {
			continue
		}
		m, err := readMeta(filepath.Join(root, name))
		if err != nil {
			broken = append(broken, &BrokenRunError{Dir: filepath.Join(root, name), Err: err})
			continue
		}
		observeStatus(&m)
		metas = append(metas, m)
	}
	sort.Slice(metas, func(i, j int) bool {
		if !metas[i].Created.Equal(metas[j].Created) {
			return metas[i].Created.After(metas[j].Created)
		}
		return metas[i].Dir > metas[j].Dir
	})
	return metas, errors.Join(broken...)
}

// observeStatus turns the stored status running into interrupted when no
// process holds the run's lock. The lock is the only evidence of a live
// process: it is taken by Create and Resume and released by the kernel
// when the process dies, however it dies. Where the lock cannot be
// probed (no flock, an unreadable lock file) the stored status stands.
//
// run.json is not rewritten here: reading a record stays read-only (it
// works on a read-only copy and never races a process that resumes the
// run between the probe and the write), and the answer is derived afresh
// on every read, so it cannot go stale.
func observeStatus(m *Meta) {
	if m.Status == StatusRunning && lockFree(filepath.Join(m.Dir, lockFileName)) {
		m.Status = StatusInterrupted
	}
}

// readMeta loads and checks run.json in dir, reporting the status as
// stored.
func readMeta(dir string) (Meta, error) {
	data, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if err != nil {
		return Meta{}, err
	}
	var m Meta
	if err := json.Unmarshal(data, &m); err != nil {
		return Meta{}, fmt.Errorf("%s: %w", MetaFile, err)
	}
	if _, err := uuid.Parse(m.ID); err != nil {
		return Meta{}, fmt.Errorf("%s: bad id %q: %w", MetaFile, m.ID, err)
	}
	if !m.Status.Valid() {
		return Meta{}, fmt.Errorf("%s: status %q: %w", MetaFile, m.Status, ErrBadStatus)
	}
	m.Dir = dir
	return m, nil
}

// writeMetaLocked stores r.meta in run.json; r.mu must be held.
func (r *Run) writeMetaLocked() error {
	r.meta.Updated = r.now().UTC()
	data, err := json.MarshalIndent(r.meta, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", MetaFile, err)
	}
	return writeFileAtomic(filepath.Join(r.dir, MetaFile), append(data, '\n'), 0o644)
}

// Dir returns the run directory.
func (r *Run) Dir() string { return r.dir }

// Meta returns a copy of the run's metadata.
func (r *Run) Meta() Meta {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.meta
}

// ID returns the full run uuid.
func (r *Run) ID() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.meta.ID
}

// Close releases the run's lock, if it holds one. The Run must not be used
// for writing afterwards by a caller relying on the lock.
func (r *Run) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lock == nil {
		return nil
	}
	err := unlockFile(r.lock)
	r.lock = nil
	return err
}

// reserved lists names that WriteFile must not overwrite.
var reserved = map[string]bool{
	MetaFile: true, MetricsFile: true, DroppedMetricsFile: true, UpdatesFile: true,
	DroppedUpdatesFile: true, LogFileName: true, CheckpointsDir: true, lockFileName: true,
}

// checkName validates a file name for WriteFile and ReadFile.
func checkName(name string) error {
	if name == "" || name != filepath.Base(name) || name == "." || name == ".." ||
		strings.ContainsAny(name, `/\`) {
		return fmt.Errorf("file name %q: must be a plain name inside the run directory", name)
	}
	return nil
}

// WriteFile atomically replaces the named file in the run directory with
// data. name must be a plain file name; the files the package manages
// itself (run.json, metrics.jsonl, updates.jsonl, their -dropped files,
// log, checkpoints and hidden files) are refused with ErrReservedName.
func (r *Run) WriteFile(name string, data []byte) error {
	if err := checkName(name); err != nil {
		return err
	}
	if reserved[name] || strings.HasPrefix(name, ".") {
		return fmt.Errorf("write %s: %w", name, ErrReservedName)
	}
	return writeFileAtomic(filepath.Join(r.dir, name), data, 0o644)
}

// ReadFile returns the contents of the named file in the run directory.
func (r *Run) ReadFile(name string) ([]byte, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(r.dir, name))
}

// WriteJSON atomically writes v as indented JSON to the named file. A
// []byte or json.RawMessage is taken to be JSON already: it is checked
// and written unchanged.
func (r *Run) WriteJSON(name string, v any) error {
	var data []byte
	switch b := v.(type) {
	case []byte:
		data = b
	case json.RawMessage:
		data = b
	default:
		var err error
		data, err = json.MarshalIndent(v, "", "  ")
		if err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		data = append(data, '\n')
	}
	if !json.Valid(data) {
		return fmt.Errorf("write %s: data is not valid JSON", name)
	}
	return r.WriteFile(name, data)
}

// WriteSpec stores the original spec bytes as spec.yaml.
func (r *Run) WriteSpec(data []byte) error { return r.WriteFile(SpecFile, data) }

// WriteResolved stores the resolved spec as resolved.json (see WriteJSON).
func (r *Run) WriteResolved(v any) error { return r.WriteJSON(ResolvedFile, v) }

// WritePlan stores the memory plan as plan.json (see WriteJSON).
func (r *Run) WritePlan(v any) error { return r.WriteJSON(PlanFile, v) }

// SetStatus records the run's status and, for a non-nil err, its message
// (a nil err clears the message). Leaving the running status records the
// finish time.
func (r *Run) SetStatus(status Status, err error) error {
	if !status.Valid() {
		return fmt.Errorf("set status %q: %w", status, ErrBadStatus)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.meta
	r.meta.Status = status
	r.meta.Error = ""
	if err != nil {
		r.meta.Error = err.Error()
	}
	if status == StatusRunning {
		r.meta.Finished = time.Time{}
	} else {
		r.meta.Finished = r.now().UTC()
	}
	if werr := r.writeMetaLocked(); werr != nil {
		r.meta = prev
		return werr
	}
	return nil
}

// SetTotalSteps records the number of steps the run is meant to take.
func (r *Run) SetTotalSteps(n int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.meta
	r.meta.TotalSteps = n
	if err := r.writeMetaLocked(); err != nil {
		r.meta = prev
		return err
	}
	return nil
}

// SetExported records dir, made absolute, as the directory of the run's HF
// export, together with the step it was made from: the run's LastStep, so
// call it after the last step's metrics line. An empty dir clears the
// record. Call it once the export is complete, so that a record naming an
// export never points at a partial one.
func (r *Run) SetExported(dir string) error {
	if dir != "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return fmt.Errorf("set exported: %w", err)
		}
		dir = abs
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.meta
	r.meta.Exported, r.meta.ExportedStep = dir, 0
	if dir != "" {
		r.meta.ExportedStep = r.meta.LastStep
	}
	if err := r.writeMetaLocked(); err != nil {
		r.meta = prev
		return err
	}
	return nil
}

// LogFile opens the run's log file for appending; the caller closes it.
// It suits zerolog.New(f) or a zerolog.MultiLevelWriter.
func (r *Run) LogFile() (io.WriteCloser, error) {
	f, err := os.OpenFile(filepath.Join(r.dir, LogFileName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	return f, nil
}
