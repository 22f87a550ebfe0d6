package jobs

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// SetupStatus is the state of one setup stage of a run (loading or
// sharding a model), summed over the ranks that report it to a
// SetupProgress.
type SetupStatus struct {
	// Index is the stage's place among the run's Stages setup stages, in
	// the order they started (1-based; Stages is 0 when unknown).
	Index, Stages int
	// Stage and Uses are the stage's id and kind; Model is the model it
	// loads or shards, if any.
	Stage, Uses, Model string
	// Tensors and Bytes are what the ranks have read of TotalTensors and
	// TotalBytes, the totals of the Counted ranks that reported theirs
	// (partial while Counted is below Ranks).
	Tensors, TotalTensors int
	Bytes, TotalBytes     int64
	Counted               int
	// RanksDone is the ranks that finished the stage, of Ranks.
	RanksDone, Ranks int
	// Share is the completed share of the stage in [0, 1]: the mean over
	// the ranks of each one's share, its bytes read of its total (tensors
	// without bytes), 0 before it reports and 1 once it finished.
	Share float64
	// Seconds is the time since the stage started; once Finished, the
	// slowest rank's time for it.
	Seconds  float64
	Finished bool
}

// opened reports whether the stage is one that reads nothing of its
// totals (it opens what a later stage reads: load_hf, the checkpoint).
func (s SetupStatus) opened() bool {
	return s.TotalBytes > 0 && s.Bytes == 0 && s.Tensors == 0 && s.RanksDone > 0
}

// Rates of the setup report: a terminal line is redrawn at most every
// setupRedraw; a plain line (and a report to log) is written when another
// setupShare of a stage is read and setupGap has passed since the last,
// or when setupQuiet has passed with some progress.
const (
	setupRedraw = 100 * time.Millisecond
	setupShare  = 0.1
	setupGap    = time.Second
	setupQuiet  = 10 * time.Second
)

// SetupProgress shows the progress of a run's setup stages, which load
// and shard its models, as the ranks report it. On a terminal it redraws
// one line in place for the running stage (a bar, bytes and tensors read,
// ranks done, time), fitted to the terminal width, and leaves a line for
// each finished stage; otherwise it writes plain lines: when a stage
// starts, at every further tenth of it done (at most one a second, and
// one at least every ten seconds while it advances) and when it finishes.
//
// Its methods are safe for concurrent use by the ranks. Each returns the
// stage's status and whether the call is one to log: a stage's first
// start, its progress at the plain lines' rate, and its finish on the
// last rank.
type SetupProgress struct {
	display
	stages int // the run's setup stages (0: unknown)
	ranks  int // the ranks reporting here
	byID   map[string]*setupStage
	order  []*setupStage // in the order they started
	drawn  time.Time     // when the terminal line was last drawn
	done   bool
}

// setupStage is one stage's state: each rank's counts, summed for its
// SetupStatus.
type setupStage struct {
	status   SetupStatus
	start    time.Time
	ranks    map[int]*setupRank
	reported time.Time // the last report to log (its start)
	share    float64   // the share done at that report
}

// setupRank is a rank's counts of a stage.
type setupRank struct {
	tensors, totalTensors int
	bytes, totalBytes     int64
	seconds               float64
	finished              bool
}

// NewSetupProgress returns a SetupProgress writing to w for a run of
// stages setup stages (0 if unknown) run by ranks ranks reporting here.
// isTerminal selects the redrawn line.
func NewSetupProgress(w io.Writer, stages, ranks int, isTerminal bool) *SetupProgress {
	return &SetupProgress{display: display{w: w, term: isTerminal, width: widthOf(w, isTerminal), now: time.Now},
		stages: stages, ranks: max(ranks, 1), byID: map[string]*setupStage{}}
}

// stage returns the state of stage id, and whether this call started it
// (its first rank's first report).
func (p *SetupProgress) stage(id string) (*setupStage, bool) {
	st, ok := p.byID[id]
	if !ok {
		st = &setupStage{start: p.now(), ranks: map[int]*setupRank{},
			status: SetupStatus{Index: len(p.order) + 1, Stages: p.stages, Stage: id, Ranks: p.ranks}}
		st.reported = st.start
		p.byID[id] = st
		p.order = append(p.order, st)
	}
	return st, !ok
}

// current is the stage the terminal line shows: the first one started
// that has not finished on every rank (ranks run the stages in the same
// order, so they finish in the order they started). It is nil when none
// runs.
func (p *SetupProgress) current() *setupStage {
	for _, st := range p.order {
		if !st.status.Finished {
			return st
		}
	}
	return nil
}

// rank returns rank's counts of st.
func (st *setupStage) rank(r int) *setupRank {
	c, ok := st.ranks[r]
	if !ok {
		c = &setupRank{}
		st.ranks[r] = c
	}
	return c
}

// sum fills the stage's status from its ranks' counts at now.
func (st *setupStage) sum(now time.Time) SetupStatus {
	s := &st.status
	s.Tensors, s.TotalTensors, s.Bytes, s.TotalBytes, s.Counted, s.RanksDone = 0, 0, 0, 0, 0, 0
	var slowest, share float64
	for _, c := range st.ranks {
		s.Tensors += c.tensors
		s.TotalTensors += c.totalTensors
		s.Bytes += c.bytes
		s.TotalBytes += c.totalBytes
		if c.totalTensors > 0 || c.totalBytes > 0 {
			s.Counted++
		}
		switch {
		case c.finished:
			s.RanksDone++
			slowest = max(slowest, c.seconds)
			share++
		case c.totalBytes > 0:
			share += min(1, float64(c.bytes)/float64(c.totalBytes))
		case c.totalTensors > 0:
			share += min(1, float64(c.tensors)/float64(c.totalTensors))
		}
	}
	s.Share = share / float64(s.Ranks)
	s.Finished = s.RanksDone >= s.Ranks
	s.Seconds = now.Sub(st.start).Seconds()
	if s.Finished {
		s.Seconds = slowest
	}
	return *s
}

// Start reports that rank began stage (of kind uses, for model). The
// first rank's start is the one to log.
func (p *SetupProgress) Start(rank int, stage, uses, model string) (SetupStatus, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st, first := p.stage(stage)
	st.status.Uses, st.status.Model = uses, model
	st.rank(rank)
	now := p.now()
	s := st.sum(now)
	if !first || p.done {
		return s, first
	}
	if !p.term {
		p.write(plainSetupLine(s) + "\n")
	} else if p.current() == st {
		p.draw(s, now)
	}
	return s, true
}

// Advance reports rank's counts of stage: tensors and bytes read of
// totalTensors and totalBytes.
func (p *SetupProgress) Advance(rank int, stage string, tensors, totalTensors int, bytes, totalBytes int64) (SetupStatus, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st, _ := p.stage(stage)
	c := st.rank(rank)
	c.tensors, c.totalTensors, c.bytes, c.totalBytes = tensors, totalTensors, bytes, totalBytes
	now := p.now()
	s := st.sum(now)
	if p.done {
		return s, false
	}
	share, since := s.Share, now.Sub(st.reported)
	// A stage read whole is reported by its finish, next.
	report := share > st.share && share < 1 && (share-st.share >= setupShare && since >= setupGap || since >= setupQuiet)
	if report {
		st.reported, st.share = now, share
	}
	switch {
	case p.term && p.current() == st && now.Sub(p.drawn) >= setupRedraw:
		p.draw(s, now)
	case !p.term && report:
		p.write(plainSetupLine(s) + "\n")
	}
	return s, report
}

// Finish reports that rank finished stage after seconds. The last rank's
// finish is the one to log.
func (p *SetupProgress) Finish(rank int, stage string, seconds float64) (SetupStatus, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st, _ := p.stage(stage)
	c := st.rank(rank)
	if c.finished {
		return st.status, false
	}
	c.finished, c.seconds = true, seconds
	now := p.now()
	s := st.sum(now)
	if !s.Finished || p.done {
		return s, s.Finished
	}
	if !p.term {
		p.write(plainSetupLine(s) + "\n")
		return s, true
	}
	// The stage's last line stays; the next one running takes its place.
	p.draw(s, now)
	p.write("\n")
	p.lastLen = 0
	if next := p.current(); next != nil {
		p.draw(next.sum(now), now)
	}
	return s, true
}

// Done ends the report: on a terminal it finishes a line left drawn.
// Later calls still return the stages' status but write nothing.
func (p *SetupProgress) Done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	p.done = true
	if p.term && p.lastLen > 0 {
		p.write("\n")
	}
}

// draw redraws the terminal line with s.
func (p *SetupProgress) draw(s SetupStatus, now time.Time) {
	p.redraw(termSetupLine(s, p.width()-1))
	p.drawn = now
}

// setupName is "setup 2/3 shard_actor".
func setupName(s SetupStatus) string {
	if s.Stages > 0 {
		return fmt.Sprintf("setup %d/%d %s", s.Index, s.Stages, s.Stage)
	}
	return "setup " + s.Stage
}

// setupKind is "apply_fsdp2 actor".
func setupKind(s SetupStatus) string {
	return strings.TrimSpace(s.Uses + " " + s.Model)
}

// setupCounts returns the stage's parts to show: bytes (with the
// percentage while it runs), tensors and ranks. A stage that reads
// nothing of its totals (load_hf opens the checkpoint apply_fsdp2 reads)
// shows them as opened; while some ranks have not reported their totals,
// what the ranks read shows without them.
func setupCounts(s SetupStatus) (bytes, tensors, ranks string) {
	partial := s.Counted < s.Ranks && !s.Finished
	switch {
	case s.opened():
		bytes = "opened " + formatBytes(s.TotalBytes)
	case s.TotalBytes > 0 && s.Finished:
		bytes = formatBytes(s.Bytes)
	case s.TotalBytes > 0 && partial:
		bytes = fmt.Sprintf("%s %3d%%", formatBytes(s.Bytes), int(100*s.Share))
	case s.TotalBytes > 0:
		bytes = fmt.Sprintf("%s %3d%%", formatBytePair(s.Bytes, s.TotalBytes), int(100*s.Share))
	}
	switch {
	case s.TotalTensors > 0 && (s.Finished || s.opened()):
		tensors = strconv.Itoa(s.TotalTensors) + " tensors"
	case s.TotalTensors > 0 && partial && s.Tensors == 1:
		tensors = "1 tensor"
	case s.TotalTensors > 0 && partial:
		tensors = fmt.Sprintf("%d tensors", s.Tensors)
	case s.TotalTensors > 0:
		tensors = fmt.Sprintf("%d/%d tensors", s.Tensors, s.TotalTensors)
	}
	if s.Ranks > 1 && !s.Finished {
		ranks = fmt.Sprintf("ranks %d/%d done", s.RanksDone, s.Ranks)
	}
	return bytes, tensors, ranks
}

// plainSetupLine formats a log line:
// "setup 2/3 shard_actor (apply_fsdp2 actor): started",
// "setup 2/3 shard_actor: 1.2/3.1 GiB  40%, 120/339 tensors, 12s",
// "setup 2/3 shard_actor: done in 31.2s, 3.1 GiB, 339 tensors".
func plainSetupLine(s SetupStatus) string {
	bytes, tensors, ranks := setupCounts(s)
	var parts []string
	switch {
	case s.Finished:
		parts = append(parts, "done in "+formatSeconds(s.Seconds))
	case s.Bytes == 0 && s.Tensors == 0 && s.RanksDone == 0:
		return setupName(s) + " (" + setupKind(s) + "): started"
	}
	for _, x := range []string{bytes, tensors, ranks} {
		if x != "" {
			parts = append(parts, x)
		}
	}
	if !s.Finished {
		parts = append(parts, formatDuration(time.Duration(s.Seconds*float64(time.Second))))
	}
	return setupName(s) + ": " + strings.Join(parts, ", ")
}

// termSetupLine formats the redrawn line in at most avail characters:
// "setup 2/3 shard_actor  [====>     ] 1.2/3.1 GiB  40%  120/339 tensors  ranks 1/2 done  12s".
// When space runs short the bar goes first, then the ranks, the tensors,
// the time and the bytes.
func termSetupLine(s SetupStatus, avail int) string {
	bytes, tensors, ranks := setupCounts(s)
	name := setupName(s)
	when := formatDuration(time.Duration(s.Seconds * float64(time.Second)))
	if s.Finished {
		when = "done in " + formatSeconds(s.Seconds)
	} else if bytes == "" && tensors == "" {
		name += " (" + setupKind(s) + ")"
	}
	join := func(parts ...string) string {
		var kept []string
		for _, x := range parts {
			if x != "" {
				kept = append(kept, x)
			}
		}
		return strings.Join(kept, "  ")
	}
	if s.TotalBytes > 0 && !s.Finished {
		b := bar(int(1000*s.Share), 1000, 20)
		if text := join(name, b+" "+bytes, tensors, ranks, when); len(text) <= avail {
			return text
		}
	}
	for _, text := range []string{join(name, bytes, tensors, ranks, when), join(name, bytes, tensors, when),
		join(name, bytes, when), join(name, bytes), name} {
		if len(text) <= avail {
			return text
		}
	}
	return name[:max(0, min(len(name), avail))]
}

// formatBytes formats n bytes with a binary unit: "512 B", "12.0 KiB",
// "3.1 GiB".
func formatBytes(n int64) string {
	v, unit := byteUnit(n)
	if unit == "B" {
		return strconv.FormatInt(n, 10) + " B"
	}
	return strconv.FormatFloat(float64(n)/v, 'f', 1, 64) + " " + unit
}

// formatBytePair formats done of total bytes in total's unit: "1.2/3.1 GiB".
func formatBytePair(done, total int64) string {
	v, unit := byteUnit(total)
	if unit == "B" {
		return fmt.Sprintf("%d/%d B", done, total)
	}
	return strconv.FormatFloat(float64(done)/v, 'f', 1, 64) + "/" + strconv.FormatFloat(float64(total)/v, 'f', 1, 64) + " " + unit
}

// byteUnit returns the binary unit to show n bytes in, and its size.
func byteUnit(n int64) (float64, string) {
	switch {
	case n >= 1<<30:
		return 1 << 30, "GiB"
	case n >= 1<<20:
		return 1 << 20, "MiB"
	case n >= 1<<10:
		return 1 << 10, "KiB"
	}
	return 1, "B"
}

// formatSeconds formats a stage's time: "0.01s", "4.2s", "1m05s".
func formatSeconds(s float64) string {
	switch {
	case s < 1:
		return strconv.FormatFloat(s, 'f', 2, 64) + "s"
	case s < 60:
		return strconv.FormatFloat(s, 'f', 1, 64) + "s"
	}
	return formatDuration(time.Duration(s * float64(time.Second)))
}
