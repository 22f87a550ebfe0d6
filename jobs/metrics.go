package jobs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"
)

// Metrics is one line of metrics.jsonl, what a training step measured,
// or of updates.jsonl, what one optimizer update within a step measured.
// Floating-point values that JSON cannot hold (NaN, ±Inf, as from a
// diverged loss) are written as the strings "NaN", "+Inf" and "-Inf" and
// read back as the same values. The counts Update, Epoch, MiniBatch and
// Updates are written only when non-zero.
type Metrics struct {
	Step int `json:"step"`
	// Update is the run's global, 1-based index of an optimizer update;
	// it is set on update lines only.
	Update int `json:"update,omitempty"`
	// Epoch is the 1-based PPO epoch of an update within its step.
	Epoch int `json:"epoch,omitempty"`
	// MiniBatch is the 1-based mini-batch of an update within its epoch.
	MiniBatch int `json:"mini_batch,omitempty"`
	// Updates is, on a step's summary line, how many optimizer updates
	// the step made.
	Updates      int       `json:"updates,omitempty"`
	Time         time.Time `json:"time"`   // when the step finished
	WallS        float64   `json:"wall_s"` // seconds the step took
	Loss         float64   `json:"loss"`
	PGLoss       float64   `json:"pg_loss"`
	KL           float64   `json:"kl"`
	Entropy      float64   `json:"entropy"`
	ClipFrac     float64   `json:"clipfrac"`
	GradNorm     float64   `json:"grad_norm"`
	LR           float64   `json:"lr"`
	Tokens       int64     `json:"tokens"`
	TokensPerS   float64   `json:"tokens_per_s"`
	PeakMemBytes int64     `json:"peak_mem_bytes"`
	// Extra holds further values; they are flattened into the JSON object
	// and must not reuse the names of the fields above.
	Extra map[string]float64 `json:"-"`
}

// countKeys are the JSON names of the counts written only when non-zero,
// in output order (after step).
var countKeys = []string{"update", "epoch", "mini_batch", "updates"}

// valueKeys are the JSON names of the fields always written after step,
// the counts and time, in output order.
var valueKeys = []string{
	"wall_s", "loss", "pg_loss", "kl", "entropy", "clipfrac",
	"grad_norm", "lr", "tokens", "tokens_per_s", "peak_mem_bytes",
}

// metricKeySet holds the JSON names of all fixed fields, which Extra must
// not reuse.
var metricKeySet = func() map[string]bool {
	s := map[string]bool{"step": true, "time": true}
	for _, k := range append(countKeys, valueKeys...) {
		s[k] = true
	}
	return s
}()

// counts returns pointers to the count fields keyed by JSON name.
func (m *Metrics) counts() map[string]*int {
	return map[string]*int{
		"update": &m.Update, "epoch": &m.Epoch, "mini_batch": &m.MiniBatch, "updates": &m.Updates,
	}
}

// floats returns pointers to the float fields keyed by JSON name.
func (m *Metrics) floats() map[string]*float64 {
	return map[string]*float64{
		"wall_s": &m.WallS, "loss": &m.Loss, "pg_loss": &m.PGLoss, "kl": &m.KL,
		"entropy": &m.Entropy, "clipfrac": &m.ClipFrac, "grad_norm": &m.GradNorm,
		"lr": &m.LR, "tokens_per_s": &m.TokensPerS,
	}
}

// appendFloat writes v as a JSON number, or as a string for NaN and ±Inf.
func appendFloat(b []byte, v float64) []byte {
	switch {
	case math.IsNaN(v):
		return append(b, `"NaN"`...)
	case math.IsInf(v, 1):
		return append(b, `"+Inf"`...)
	case math.IsInf(v, -1):
		return append(b, `"-Inf"`...)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}

// parseFloat reads a JSON number or one of the strings appendFloat writes.
func parseFloat(raw json.RawMessage) (float64, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, err
		}
		switch s {
		case "NaN":
			return math.NaN(), nil
		case "+Inf", "Inf":
			return math.Inf(1), nil
		case "-Inf":
			return math.Inf(-1), nil
		}
		return 0, fmt.Errorf("not a number: %q", s)
	}
	var v float64
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, err
	}
	return v, nil
}

// MarshalJSON encodes m as one flat JSON object with fixed fields first
// and Extra keys after them in sorted order.
func (m Metrics) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 320)
	b = append(b, `{"step":`...)
	b = strconv.AppendInt(b, int64(m.Step), 10)
	cs := m.counts()
	for _, k := range countKeys {
		if v := *cs[k]; v != 0 {
			b = append(b, ',', '"')
			b = append(b, k...)
			b = append(b, '"', ':')
			b = strconv.AppendInt(b, int64(v), 10)
		}
	}
	if !m.Time.IsZero() {
		b = append(b, `,"time":`...)
		b = strconv.AppendQuote(b, m.Time.UTC().Format(time.RFC3339Nano))
	}
	fl := m.floats()
	for _, k := range valueKeys {
		b = append(b, ',', '"')
		b = append(b, k...)
		b = append(b, '"', ':')
		switch k {
		case "tokens":
			b = strconv.AppendInt(b, m.Tokens, 10)
		case "peak_mem_bytes":
			b = strconv.AppendInt(b, m.PeakMemBytes, 10)
		default:
			b = appendFloat(b, *fl[k])
		}
	}
	keys := make([]string, 0, len(m.Extra))
	for k := range m.Extra {
		if k == "" || metricKeySet[k] {
			return nil, fmt.Errorf("metrics extra key %q: empty or reserved", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		kb, err := json.Marshal(k)
		if err != nil {
			return nil, err
		}
		b = append(b, ',')
		b = append(b, kb...)
		b = append(b, ':')
		b = appendFloat(b, m.Extra[k])
	}
	return append(b, '}'), nil
}

// UnmarshalJSON decodes a line written by MarshalJSON. Unknown numeric
// keys go to Extra; unknown non-numeric keys are ignored so that newer
// writers stay readable. The step key is required.
func (m *Metrics) UnmarshalJSON(data []byte) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		return err
	}
	if obj == nil {
		return errors.New("metrics: not an object")
	}
	*m = Metrics{}
	raw, ok := obj["step"]
	if !ok {
		return errors.New("metrics: missing step")
	}
	if err := json.Unmarshal(raw, &m.Step); err != nil {
		return fmt.Errorf("metrics step: %w", err)
	}
	fl := m.floats()
	cs := m.counts()
	for k, raw := range obj {
		var err error
		if p, ok := cs[k]; ok {
			if err := json.Unmarshal(raw, p); err != nil {
				return fmt.Errorf("metrics %s: %w", k, err)
			}
			continue
		}
		switch k {
		case "step":
		case "time":
			err = json.Unmarshal(raw, &m.Time)
		case "tokens":
			err = json.Unmarshal(raw, &m.Tokens)
		case "peak_mem_bytes":
			err = json.Unmarshal(raw, &m.PeakMemBytes)
		default:
			if p, ok := fl[k]; ok {
				*p, err = parseFloat(raw)
				break
			}
			v, perr := parseFloat(raw)
			if perr != nil {
				continue // not a number: a field from a newer writer
			}
			if m.Extra == nil {
				m.Extra = make(map[string]float64)
			}
			m.Extra[k] = v
		}
		if err != nil {
			return fmt.Errorf("metrics %s: %w", k, err)
		}
	}
	return nil
}

// Fields returns the values worth showing in a progress line: loss and
// tokens per second first, then the other losses and the Extra values in
// sorted order.
func (m Metrics) Fields() []Field {
	fs := []Field{
		F("loss", m.Loss), F("tok/s", m.TokensPerS), F("pg_loss", m.PGLoss),
		F("kl", m.KL), F("entropy", m.Entropy), F("clipfrac", m.ClipFrac),
		F("grad_norm", m.GradNorm), F("lr", m.LR),
	}
	keys := make([]string, 0, len(m.Extra))
	for k := range m.Extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fs = append(fs, F(k, m.Extra[k]))
	}
	return fs
}

// metricsPath returns the path of metrics.jsonl.
func (r *Run) metricsPath() string { return filepath.Join(r.dir, MetricsFile) }

// updatesPath returns the path of updates.jsonl.
func (r *Run) updatesPath() string { return filepath.Join(r.dir, UpdatesFile) }

// checkCounts refuses negative counts.
func checkCounts(m Metrics) error {
	cs := m.counts()
	for _, k := range countKeys {
		if v := *cs[k]; v < 0 {
			return fmt.Errorf("%s %d: negative", k, v)
		}
	}
	return nil
}

// AppendMetrics appends m as one line to metrics.jsonl and fsyncs it, then
// records m.Step as the last completed step if it is the highest so far.
// A zero m.Time is set to the current time. Steps start at 1. m.Update
// must be 0: lines of single updates go to AppendUpdate; m.Updates may
// say how many updates the step made.
func (r *Run) AppendMetrics(m Metrics) error {
	if m.Step < 1 {
		return fmt.Errorf("append metrics: step %d: steps start at 1", m.Step)
	}
	if m.Update != 0 {
		return fmt.Errorf("append metrics: update %d: a step line has no update index (use AppendUpdate)", m.Update)
	}
	if err := checkCounts(m); err != nil {
		return fmt.Errorf("append metrics: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.appendLineLocked(r.metricsPath(), &r.tailChecked, m); err != nil {
		return fmt.Errorf("append metrics: %w", err)
	}
	if m.Step > r.meta.LastStep {
		prev := r.meta
		r.meta.LastStep = m.Step
		if err := r.writeMetaLocked(); err != nil {
			r.meta = prev
			return fmt.Errorf("append metrics: line written, run.json not updated: %w", err)
		}
	}
	return nil
}

// AppendUpdate appends m, what one optimizer update measured, as one line
// to updates.jsonl and fsyncs it, as AppendMetrics does for a step.
// m.Step is the step the update belongs to (from 1) and m.Update the
// run's global update index (from 1); Epoch and MiniBatch, 1-based, are
// optional. A zero m.Time is set to the current time. It does not change
// LastStep: a step is complete only once its summary line is in
// metrics.jsonl.
func (r *Run) AppendUpdate(m Metrics) error {
	if m.Step < 1 {
		return fmt.Errorf("append update: step %d: steps start at 1", m.Step)
	}
	if m.Update < 1 {
		return fmt.Errorf("append update: update %d: updates start at 1", m.Update)
	}
	if err := checkCounts(m); err != nil {
		return fmt.Errorf("append update: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.appendLineLocked(r.updatesPath(), &r.updChecked, m); err != nil {
		return fmt.Errorf("append update: %w", err)
	}
	return nil
}

// appendLineLocked appends m as one line to the JSONL file at path,
// repairing the file's tail first unless *checked says it was already
// done; r.mu must be held.
func (r *Run) appendLineLocked(path string, checked *bool, m Metrics) error {
	if m.Time.IsZero() {
		m.Time = r.now().UTC()
	}
	line, err := m.MarshalJSON()
	if err != nil {
		return err
	}
	line = append(line, '\n')
	if !*checked {
		if err := repairTail(path); err != nil {
			return err
		}
		*checked = true
	}
	if err := appendSync(path, line); err != nil {
		// The line may be partly written; check the tail before the
		// next append.
		*checked = false
		return err
	}
	return nil
}

// repairTail makes the JSONL file at path end with a newline before an
// append. A final line cut short by a crash was never acknowledged and is
// cut off; a complete final line that only lacks its newline gets one.
func repairTail(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	last := make([]byte, 1)
	st, err := f.Stat()
	if err == nil && st.Size() > 0 {
		_, err = f.ReadAt(last, st.Size()-1)
	}
	f.Close()
	if err != nil {
		return err
	}
	if st.Size() == 0 || last[0] == '\n' {
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	keep := bytes.LastIndexByte(data, '\n') + 1
	var m Metrics
	if json.Unmarshal(data[keep:], &m) == nil {
		return appendSync(path, []byte{'\n'})
	}
	f, err = os.OpenFile(path, os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	terr := f.Truncate(int64(keep))
	return errors.Join(terr, f.Sync(), f.Close())
}

// metricsLine is one parsed line of a JSONL metrics file with its bytes.
type metricsLine struct {
	m   Metrics
	raw []byte // including the newline
}

// readMetricsLines parses the JSONL metrics file at path (metrics.jsonl
// or updates.jsonl). A missing file has no lines. A final line without a
// newline that does not parse is dropped and reported with an error
// wrapping ErrTruncatedMetrics next to the good lines; a bad line
// anywhere else is an error and no lines are returned.
func readMetricsLines(path string) ([]metricsLine, error) {
	name := filepath.Base(path)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	var (
		lines []metricsLine
		warn  error
	)
	for n := 1; len(data) > 0; n++ {
		i := bytes.IndexByte(data, '\n')
		final := i < 0
		var raw []byte
		if final {
			raw, data = data, nil
		} else {
			raw, data = data[:i+1], data[i+1:]
		}
		text := bytes.TrimSpace(raw)
		if len(text) == 0 {
			continue
		}
		var m Metrics
		if err := json.Unmarshal(text, &m); err != nil {
			if final {
				warn = fmt.Errorf("%s line %d (%d bytes): %w", name, n, len(raw), ErrTruncatedMetrics)
				break
			}
			return nil, fmt.Errorf("read %s: line %d: %w", name, n, err)
		}
		if final {
			raw = append(raw[:len(raw):len(raw)], '\n')
		}
		lines = append(lines, metricsLine{m: m, raw: raw})
	}
	return lines, warn
}

// readMetricsFile returns the metrics of every line of the file at path.
func readMetricsFile(path string) ([]Metrics, error) {
	lines, err := readMetricsLines(path)
	if lines == nil {
		return nil, err
	}
	ms := make([]Metrics, len(lines))
	for i, l := range lines {
		ms[i] = l.m
	}
	return ms, err
}

// Metrics reads every line of metrics.jsonl in file order. If the last
// line was cut short by a crash it is ignored and the other lines are
// returned with an error wrapping ErrTruncatedMetrics, which callers may
// treat as a warning. Any other bad line is an error and returns no
// metrics, so a damaged file is never misread.
func (r *Run) Metrics() ([]Metrics, error) { return readMetricsFile(r.metricsPath()) }

// Updates reads every line of updates.jsonl in file order, one per
// optimizer update, with the same handling of a cut-short last line
// (ErrTruncatedMetrics next to the other lines) and of damaged lines as
// Metrics. A run without update lines has none and no error.
func (r *Run) Updates() ([]Metrics, error) { return readMetricsFile(r.updatesPath()) }

// TruncateMetricsAfter atomically rewrites metrics.jsonl and
// updates.jsonl, keeping only the lines whose step is at most step (byte
// for byte) and dropping a truncated final line, then sets LastStep to the
// highest step kept in metrics.jsonl. The dropped lines are first
// appended to metrics-dropped.jsonl and updates-dropped.jsonl, so nothing
// measured is lost. It refuses to rewrite a file with a damaged line
// before the end; updates.jsonl is rewritten first, so such a refusal
// there leaves both files as they were.
func (r *Run) TruncateMetricsAfter(step int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.truncateMetricsLocked(step)
}

func (r *Run) truncateMetricsLocked(step int) error {
	if _, err := truncateLines(r.updatesPath(), filepath.Join(r.dir, DroppedUpdatesFile), step); err != nil {
		return fmt.Errorf("truncate updates: %w", err)
	}
	r.updChecked = true
	last, err := truncateLines(r.metricsPath(), filepath.Join(r.dir, DroppedMetricsFile), step)
	if err != nil {
		return fmt.Errorf("truncate metrics: %w", err)
	}
	r.tailChecked = true
	if r.meta.LastStep != last {
		prev := r.meta
		r.meta.LastStep = last
		if err := r.writeMetaLocked(); err != nil {
			r.meta = prev
			return fmt.Errorf("truncate metrics: %w", err)
		}
	}
	return nil
}

// truncateLines rewrites the JSONL file at path keeping the lines whose
// step is at most step, appends the others to the file at droppedPath and
// returns the highest step kept. A missing file stays missing.
func truncateLines(path, droppedPath string, step int) (last int, err error) {
	lines, err := readMetricsLines(path)
	if err != nil && !errors.Is(err, ErrTruncatedMetrics) {
		return 0, err
	}
	var buf, dropped bytes.Buffer
	for _, l := range lines {
		if l.m.Step > step {
			dropped.Write(l.raw)
			continue
		}
		buf.Write(l.raw)
		last = max(last, l.m.Step)
	}
	if dropped.Len() > 0 {
		if err := appendSync(droppedPath, dropped.Bytes()); err != nil {
			return 0, fmt.Errorf("keep dropped lines: %w", err)
		}
	}
	if lines != nil || err != nil {
		if werr := writeFileAtomic(path, buf.Bytes(), 0o644); werr != nil {
			return 0, werr
		}
	}
	return last, nil
}

// appendSync appends data to the file at path, creating it, and fsyncs it.
func appendSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	return errors.Join(werr, f.Sync(), f.Close())
}
