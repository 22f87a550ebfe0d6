package jobs

import (
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mattn/go-isatty"
)

// Field is a named value shown by Progress.
type Field struct {
	Name  string
	Value float64
}

// F returns a Field.
func F(name string, value float64) Field { return Field{Name: name, Value: value} }

// Names of fields that Progress gives their own place on a terminal.
const (
	FieldLoss       = "loss"
	FieldTokensPerS = "tok/s"
	FieldReward     = "reward"   // the mean reward of the step's rollouts
	FieldKL         = "kl"       // the KL to the reference policy
	FieldEntropy    = "entropy"  // the policy's entropy
	FieldClipFrac   = "clipfrac" // the share of tokens whose ratio was clipped
)

// termFields are the fields the terminal line shows, in the order it
// shows them, with their labels. When the line does not fit, they go in
// the order of drop (after the bar, before the ETA): the clip fraction
// (0 in on-policy runs of one update per step), tokens per second, loss,
// entropy, KL; the reward stays longest.
var termFields = []struct {
	name, label string
	drop        int
}{
	{FieldTokensPerS, "tok/s", 2},
	{FieldReward, "reward", 6},
	{FieldLoss, "loss", 3},
	{FieldKL, "kl", 5},
	{FieldEntropy, "ent", 4},
	{FieldClipFrac, "clip", 1},
}

// defaultWidth is the terminal width assumed when it cannot be found.
const defaultWidth = 80

// IsTerminal reports whether f is a terminal (including a Cygwin or MSYS
// pseudo terminal).
func IsTerminal(f *os.File) bool {
	if f == nil {
		return false
	}
	fd := f.Fd()
	return isatty.IsTerminal(fd) || isatty.IsCygwinTerminal(fd)
}

// Progress reports training progress. On a terminal it redraws one line
// in place (carriage return) with a bar, step/total, percentage, tokens
// per second, the RL metrics (reward, loss, KL, entropy, clip fraction)
// and ETA, fitted to the terminal width; otherwise it writes one plain
// line per update with every field, suitable for logs. Its methods are safe
// for concurrent use; write errors are kept for Err and otherwise ignored.
type Progress struct {
	display
	total   int
	start   time.Time
	base    int // step before the first update: rate counts from here
	started bool
	last    int
	// fit is the index of the candidate line last drawn at fitWidth
	// columns (see termLine).
	fit, fitWidth int
	done          bool
}

// display is the output Progress and SetupProgress share: a writer, on a
// terminal the line redrawn in place and the terminal's width, the clock,
// and the first write error. Their methods hold mu.
type display struct {
	mu      sync.Mutex
	w       io.Writer
	term    bool
	width   func() int
	now     func() time.Time
	lastLen int // length of the line on screen
	err     error
}

// NewProgress returns a Progress writing to w for a run of total steps
// (0 if unknown). isTerminal selects the redrawn line; pass
// IsTerminal(f) for a file. The clock for rate and ETA starts now.
func NewProgress(w io.Writer, total int, isTerminal bool) *Progress {
	p := &Progress{display: display{w: w, term: isTerminal, now: time.Now, width: widthOf(w, isTerminal)}, total: total}
	p.start = p.now()
	return p
}

// widthOf returns the function that finds the width of terminal w: asked
// from the terminal, else $COLUMNS, else defaultWidth (always, when w is
// not a terminal file).
func widthOf(w io.Writer, isTerminal bool) func() int {
	f, ok := w.(*os.File)
	if !ok || !isTerminal {
		return func() int { return defaultWidth }
	}
	return func() int {
		if n := termWidth(f); n > 0 {
			return n
		}
		if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 0 {
			return n
		}
		return defaultWidth
	}
}

// Restart starts the clock for rate, ETA and elapsed time again, now: for
// a run whose setup (loading and sharding) took a while before its first
// step.
func (p *Progress) Restart() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.start = p.now()
}

// SetWidth fixes the terminal width instead of asking the terminal.
func (d *display) SetWidth(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if n <= 0 {
		n = defaultWidth
	}
	d.width = func() int { return n }
}

// Err returns the first error met writing to the underlying writer.
func (d *display) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

// write sends s to the writer, keeping the first error.
func (d *display) write(s string) {
	if _, err := io.WriteString(d.w, s); err != nil && d.err == nil {
		d.err = err
	}
}

// redraw replaces the terminal's line with line.
func (d *display) redraw(line string) {
	pad := ""
	if n := d.lastLen - len(line); n > 0 {
		pad = strings.Repeat(" ", n)
	}
	d.write("\r" + line + pad)
	d.lastLen = len(line)
}

// Update reports that step has completed, with fields to show (the
// terminal line shows those named by the Field constants; a plain line
// shows them all, in order). The first update sets the base for the rate, so a
// resumed run's ETA counts only the steps run since NewProgress.
func (p *Progress) Update(step int, fields ...Field) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	if !p.started {
		p.started = true
		p.base = step - 1
	}
	p.last = step
	now := p.now()
	if p.term {
		p.redraw(p.termLine(step, fields, now))
		return
	}
	p.write(p.plainLine(step, fields, now) + "\n")
}

// Done ends the report: on a terminal it finishes the redrawn line, and in
// both modes it writes a summary line with the elapsed time. Later
// updates are ignored.
func (p *Progress) Done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	p.done = true
	var b strings.Builder
	if p.term && p.lastLen > 0 {
		b.WriteString("\n")
	}
	elapsed := formatDuration(p.now().Sub(p.start))
	switch {
	case !p.started:
		fmt.Fprintf(&b, "no steps run in %s\n", elapsed)
	case p.total > 0 && p.last >= p.total:
		fmt.Fprintf(&b, "done %d/%d steps in %s\n", p.last, p.total, elapsed)
	case p.total > 0:
		fmt.Fprintf(&b, "stopped at step %d/%d after %s\n", p.last, p.total, elapsed)
	default:
		fmt.Fprintf(&b, "stopped at step %d after %s\n", p.last, elapsed)
	}
	p.write(b.String())
}

// percent returns the completed share of total, clamped to [0, 100].
func (p *Progress) percent(step int) int {
	if p.total <= 0 {
		return 0
	}
	return min(100, max(0, step*100/p.total))
}

// eta estimates the time left from the rate since the first update; ok is
// false when it cannot be estimated yet.
func (p *Progress) eta(step int, now time.Time) (time.Duration, bool) {
	done := step - p.base
	if p.total <= 0 || done <= 0 {
		return 0, false
	}
	if step >= p.total {
		return 0, true
	}
	per := now.Sub(p.start) / time.Duration(done)
	return per * time.Duration(p.total-step), true
}

// plainLine formats a log line: "step 3/10 (30%) loss=0.5 tok/s=1200 eta=12s".
func (p *Progress) plainLine(step int, fields []Field, now time.Time) string {
	var b strings.Builder
	if p.total > 0 {
		fmt.Fprintf(&b, "step %d/%d (%d%%)", step, p.total, p.percent(step))
	} else {
		fmt.Fprintf(&b, "step %d", step)
	}
	for _, f := range fields {
		b.WriteString(" " + f.Name + "=" + formatPlain(f))
	}
	if d, ok := p.eta(step, now); ok {
		b.WriteString(" eta=" + formatDuration(d))
	}
	b.WriteString(" elapsed=" + formatDuration(now.Sub(p.start)))
	return b.String()
}

// termLine formats the redrawn line, at most width-1 characters so that
// the terminal never wraps it:
// "[=====>              ] 3/10  30%  12.3k tok/s  reward 0.5  loss 0.4312  kl 0.001  ent 1.2  clip 0.01  ETA 1m05s".
// When space runs short the bar shrinks, then goes, then the fields go by
// their priority (see termFields), then the ETA.
func (p *Progress) termLine(step int, fields []Field, now time.Time) string {
	avail := p.width() - 1
	core := fmt.Sprintf("%d/%d %3d%%", step, p.total, p.percent(step))
	if p.total <= 0 {
		core = fmt.Sprintf("step %d", step)
	}
	shown := make([]string, len(termFields))
	for _, f := range fields {
		for i, tf := range termFields {
			switch {
			case f.Name != tf.name:
			case f.Name == FieldTokensPerS:
				shown[i] = formatHuman(f.Value) + " tok/s"
			default:
				shown[i] = tf.label + " " + formatNum(f.Value)
			}
		}
	}
	eta := ""
	if d, ok := p.eta(step, now); ok {
		eta = "ETA " + formatDuration(d)
	} else if p.total > 0 {
		eta = "ETA --"
	}
	// line joins core, the fields not dropped at level drop, and eta.
	line := func(drop int, eta string) string {
		parts := []string{core}
		for i, s := range shown {
			if s != "" && termFields[i].drop > drop {
				parts = append(parts, s)
			}
		}
		if eta != "" {
			parts = append(parts, eta)
		}
		return strings.Join(parts, "  ")
	}
	// The candidates, best first: the line with a bar of a fixed width (40
	// on a terminal of 120 columns or more, else 20), then of 10, then
	// without a bar, then with fewer fields, then the core alone. A redraw
	// at the same width takes none better than the last one drawn, so that
	// what went for a long value does not come and go between redraws.
	var cands []string
	full := line(0, eta)
	if p.total > 0 {
		barW := 20
		if avail >= 119 {
			barW = 40
		}
		for _, w := range []int{barW, 10} {
			cands = append(cands, bar(step, p.total, w)+" "+full)
		}
	}
	for drop := 0; drop <= len(termFields); drop++ {
		cands = append(cands, line(drop, eta))
	}
	cands = append(cands, core)
	if avail != p.fitWidth {
		p.fit, p.fitWidth = 0, avail
	}
	for i := p.fit; i < len(cands); i++ {
		if len(cands[i]) <= avail {
			p.fit = i
			return cands[i]
		}
	}
	p.fit = len(cands) - 1
	return core[:max(0, min(len(core), avail))]
}

// bar draws "[====>     ]" with inner width w.
func bar(step, total, w int) string {
	filled := min(w, max(0, step*w/total))
	var b strings.Builder
	b.WriteByte('[')
	b.WriteString(strings.Repeat("=", filled))
	if filled < w {
		if filled > 0 {
			b.WriteByte('>')
			filled++
		}
		b.WriteString(strings.Repeat(" ", w-filled))
	}
	b.WriteByte(']')
	return b.String()
}

// formatPlain formats a field for a log line: tokens per second as a
// whole number, the rest with four significant digits.
func formatPlain(f Field) string {
	if f.Name == FieldTokensPerS && !math.IsNaN(f.Value) && !math.IsInf(f.Value, 0) {
		return strconv.FormatFloat(f.Value, 'f', 0, 64)
	}
	return formatNum(f.Value)
}

// formatNum formats v with four significant digits.
func formatNum(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }

// formatHuman formats v with a k, M or G suffix: 12345 → "12.3k".
func formatHuman(v float64) string {
	a := math.Abs(v)
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return formatNum(v)
	case a >= 1e9:
		return strconv.FormatFloat(v/1e9, 'f', 1, 64) + "G"
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', 1, 64) + "M"
	case a >= 1e3:
		return strconv.FormatFloat(v/1e3, 'f', 1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

// formatDuration formats d as "45s", "3m05s" or "2h03m".
func formatDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	s := int64(d.Round(time.Second) / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	}
	return fmt.Sprintf("%dh%02dm", s/3600, (s%3600)/60)
}
