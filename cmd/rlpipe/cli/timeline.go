package cli

import (
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/rlpipe/rlpipe/jobs"
	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/stages"
	"github.com/rs/zerolog"
)

// writeTimeline writes step sr's timeline (rank 0's) under the run
// directory, as timeline/step-NNNNNN.json, and returns its path.
func writeTimeline(runDir string, sr stages.StepResult) (string, error) {
	dir := filepath.Join(runDir, jobs.TimelineDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("timeline: %w", err)
	}
	path := filepath.Join(dir, jobs.TimelineFile(sr.Step))
	err := model.WriteFileAtomic(path, 0o644, func(w io.Writer) error { return sr.Timeline.WriteTrace(w, 0, sr.Step) })
	if err != nil {
		return "", fmt.Errorf("timeline: %w", err)
	}
	return path, nil
}

// timelineWaits is a step's waits of the compute stream for the side
// stream, in seconds by stage and what it waited for, with their total,
// for the run log.
func timelineWaits(tl *stages.StepTimeline) *zerolog.Event {
	d := zerolog.Dict()
	var total float64
	for _, k := range slices.Sorted(maps.Keys(tl.Wait)) {
		d = d.Float64(k, tl.Wait[k].Seconds())
		total += tl.Wait[k].Seconds()
	}
	d = d.Float64("total", total).Float64("side_busy", tl.Side.Seconds())
	if tl.Down > 0 {
		d = d.Float64("down_busy", tl.Down.Seconds())
	}
	return d.Float64("span", tl.Span.Seconds())
}

// timelineIdle is a step's time, in seconds by stage, that the compute
// stream had no op before the stage's first: host work between stages
// that the device did not overlap.
func timelineIdle(tl *stages.StepTimeline) *zerolog.Event {
	d := zerolog.Dict()
	for _, k := range slices.Sorted(maps.Keys(tl.Idle)) {
		d = d.Float64(k, tl.Idle[k].Seconds())
	}
	return d
}
