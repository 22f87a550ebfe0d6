package cli

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/rlpipe/rlpipe/jobs"
	"github.com/rlpipe/rlpipe/stages"
)

func cmdExport(_ context.Context, env *cli, args []string) int {
	fs := newFlagSet("export", `Usage: rlpipe export [flags] RUN

Writes a model of a run as an HF checkpoint (config.json + model.safetensors)
from one of the run's committed checkpoints: the latest, or --step N. RUN is
a run id, an id prefix, or the run's directory. It reads the checkpoint's
shard files on the host and needs no GPU.

`)
	root := fs.String("runs", jobs.DefaultRoot, "directory of run records")
	step := fs.Int("step", 0, "the checkpoint's step (default: the latest)")
	name := fs.String("model", "actor", "the model to export")
	dtype := fs.String("dtype", "", "dtype of the exported weights: bf16, fp16, fp32 (default: the config's)")
	out := fs.String("out", "", "output directory (default: RUN/export/MODEL-step-N)")
	if code, ok := parseFlags(fs, env, args, "RUN"); !ok {
		return code
	}
	if *step < 0 {
		return env.usageError("--step %d: must be at least 1 (0, the default, is the latest checkpoint)", *step)
	}
	if *dtype != "" {
		if _, err := stages.ExportDType(*dtype); err != nil {
			return env.usageError("--dtype: %v", err)
		}
	}
	rec, err := openRun(*root, fs.Arg(0))
	if err != nil {
		return env.report(err)
	}
	s, err := recordSpec(rec)
	if err != nil {
		return env.report(err)
	}
	l, err := resolveSpec(s, "", stages.CheckPlan)
	if err != nil {
		return env.report(err)
	}
	if err := checkExportModel(l.job, *name); err != nil {
		return env.usageError("%v", err)
	}
	cks, err := rec.Checkpoints()
	if err != nil {
		return env.report(err)
	}
	var dir string
	at := 0
	for _, c := range cks {
		if *step == 0 || c.Step == *step {
			dir, at = c.Dir, c.Step
		}
	}
	if dir == "" {
		var have []int
		for _, c := range cks {
			have = append(have, c.Step)
		}
		if *step == 0 {
			return env.report(fmt.Errorf("run %s has no committed checkpoint", rec.ID()[:8]))
		}
		return env.report(fmt.Errorf("run %s has no committed checkpoint at step %d (committed: %v)", rec.ID()[:8], *step, have))
	}
	if *out == "" {
		*out = filepath.Join(rec.Dir(), "export", fmt.Sprintf("%s-step-%d", *name, at))
	}
	if err := stages.ExportCheckpoint(l.job, *name, dir, *out, *dtype); err != nil {
		return env.report(err)
	}
	fmt.Fprintf(env.stdout, "exported %s of run %s at step %d: %s (HF checkpoint)\n", *name, rec.ID()[:8], at, *out)
	return exitOK
}
