package stages

import (
	"time"

	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/spec"
)

// SetupEventKind says what a SetupEvent reports.
type SetupEventKind string

// The kinds of setup events, in the order a rank sends them: for every
// setup stage SetupStarted, any number of SetupProgress, SetupFinished;
// then, once all setup stages (and a resume's restore) are done,
// SetupDone.
const (
	SetupStarted  SetupEventKind = "started"
	SetupProgress SetupEventKind = "progress"
	SetupFinished SetupEventKind = "finished"
	SetupDone     SetupEventKind = "done"
)

// SetupEvent reports the progress of a setup stage on one rank, for
// RunOptions.Progress. load_hf, which opens a checkpoint and reads no
// tensor data, reports the checkpoint's totals (TotalTensors and
// TotalBytes, nothing read yet) on rank 0 alone: the ranks share the
// checkpoint, so that the ranks' counts add up. apply_fsdp2 reports the
// tensors and bytes of the rank's rows read into its shard, once per
// tensor, against the totals of the rank's rows, known before the first
// is read.
type SetupEvent struct {
	Kind  SetupEventKind
	Rank  int // the rank that sends it
	World int // the mesh's ranks
	// Stage and Uses are the stage's id and kind; Model is the model it
	// loads or shards ("" for other kinds). All three are empty in a
	// SetupDone event.
	Stage, Uses, Model string
	// Tensors and Bytes are what the stage has read so far on the rank,
	// of TotalTensors and TotalBytes. A SetupFinished event carries the
	// stage's last progress.
	Tensors, TotalTensors int
	Bytes, TotalBytes     int64
	// Seconds is the stage's wall time on the rank, its device synced, in
	// a SetupFinished event, and the whole setup's in a SetupDone event.
	Seconds float64
}

// setupReporter sends one rank's setup events to RunOptions.Progress (f);
// a nil reporter sends nothing. It is used by its rank's goroutine alone.
type setupReporter struct {
	f       func(SetupEvent)
	rank    int
	world   int
	t0      time.Time  // the setup's start
	current SetupEvent // the running stage, with its latest progress
}

func newSetupReporter(f func(SetupEvent), rank, world int) *setupReporter {
	if f == nil {
		return nil
	}
	return &setupReporter{f: f, rank: rank, world: world, t0: time.Now()}
}

// send fills in the rank and sends ev.
func (s *setupReporter) send(ev SetupEvent) {
	ev.Rank, ev.World = s.rank, s.world
	s.f(ev)
}

// start reports that stage st (resolved as stage) begins.
func (s *setupReporter) start(st *spec.Stage, stage Stage) {
	if s == nil {
		return
	}
	s.current = SetupEvent{Stage: st.ID, Uses: st.Uses, Model: stageModel(stage)}
	ev := s.current
	ev.Kind = SetupStarted
	s.send(ev)
}

// progress reports the running stage's counts.
func (s *setupReporter) progress(tensors, totalTensors int, bytes, totalBytes int64) {
	if s == nil {
		return
	}
	s.current.Tensors, s.current.TotalTensors, s.current.Bytes, s.current.TotalBytes = tensors, totalTensors, bytes, totalBytes
	ev := s.current
	ev.Kind = SetupProgress
	s.send(ev)
}

// finish reports that the running stage finished after seconds.
func (s *setupReporter) finish(seconds float64) {
	if s == nil {
		return
	}
	ev := s.current
	ev.Kind, ev.Seconds = SetupFinished, seconds
	s.send(ev)
	s.current = SetupEvent{}
}

// done reports that the rank's setup is done.
func (s *setupReporter) done() {
	if s == nil {
		return
	}
	s.send(SetupEvent{Kind: SetupDone, Seconds: time.Since(s.t0).Seconds()})
}

// stageModel is the model a setup stage loads or shards.
func stageModel(s Stage) string {
	switch s := s.(type) {
	case *LoadHF:
		return s.Model
	case *ApplyFSDP2:
		return s.Model
	}
	return ""
}

// reportCheckpoint reports the totals of checkpoint ck, its tensors and
// their bytes, on rank 0.
func (p *prog) reportCheckpoint(ck *model.Checkpoint) {
	if !p.running() || p.r.setup == nil || p.r.ID != 0 || ck == nil {
		return
	}
	var tensors int
	var bytes int64
	for _, f := range ck.Files {
		for _, t := range f.Tensors {
			tensors++
			bytes += t.End - t.Begin
		}
	}
	p.r.setup.progress(0, tensors, 0, bytes)
}

// shardLoad counts what loadShards reads on the rank: one tensor per
// parameter of st the rank holds rows of, in the dtype ck stores it in.
// It reports as it goes (add, once per tensor).
type shardLoad struct {
	r               *setupReporter
	tensors, total  int
	bytes, totBytes int64
}

// newShardLoad counts the rows of st's params in ck that rank reads (every
// row for a replica, whose loadShards reads as rank 0) and reports
// that none is read yet; a parameter ck lacks is left out, for loadShards
// to report (as it does a nil ck).
func newShardLoad(p *prog, st *ShardState, ck *model.Checkpoint, rank int) *shardLoad {
	if p.r.setup == nil || ck == nil {
		return &shardLoad{}
	}
	l := &shardLoad{r: p.r.setup}
	for _, u := range st.Units {
		for _, s := range u.Slots {
			r0 := int64(rank) * s.ShardRows
			r1 := min(r0+s.ShardRows, s.Rows())
			if s.Tied || r1 <= r0 {
				continue
			}
			if dt, err := ck.StoredDType(s.Name); err == nil {
				l.total++
				l.totBytes += (r1 - r0) * s.RowElems() * int64(dt.Size())
			}
		}
	}
	l.r.progress(0, l.total, 0, l.totBytes)
	return l
}

// add reports one more tensor of bytes read.
func (l *shardLoad) add(bytes int) {
	if l.r == nil {
		return
	}
	l.tensors++
	l.bytes += int64(bytes)
	l.r.progress(l.tensors, l.total, l.bytes, l.totBytes)
}
