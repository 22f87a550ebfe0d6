package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/jobs"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
)

func cmdExport(_ context.Context, env *cli, args []string) int {
	fs := newFlagSet("export", `Usage: rlpipe export [flags] RUN

Writes a model of a run as an HF checkpoint from one of the run's committed
checkpoints: the latest, or --step N. RUN is a run id, an id prefix, or the
run's directory. It reads the checkpoint's shard files on the host and needs
no GPU.

The export holds config.json (the source checkpoint's, in the transformers
dialect it was written in, with the export's dtype), a copy of every other
file of the source checkpoint directory but the weights (tokenizer files,
generation_config.json, chat template, README, ...), and the weights: one
model.safetensors, or, above --max-shard-size, model-0000K-of-0000N.safetensors
shards and model.safetensors.index.json. The source checkpoint directory is
the model's path in the run's spec; --source names it where it has moved.

`)
	root := fs.String("runs", jobs.DefaultRoot, "directory of run records")
	step := fs.Int("step", 0, "the checkpoint's step (default: the latest)")
	name := fs.String("model", "actor", "the model to export")
	dtype := fs.String("dtype", "", "dtype of the exported weights: bf16, fp16, fp32 (default: the config's)")
	out := fs.String("out", "", "output directory (default: RUN/export/MODEL-step-N)")
	maxShard := fs.String("max-shard-size", "5GB", "the most bytes of weights in one safetensors file, as 5GB, 500MB or 2GiB; a larger model is written in shards with an index")
	source := fs.String("source", "", "the model's source checkpoint directory, where it has moved since the run (default: its path in the run's spec)")
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
	shardSize, err := gpu.ParseBytes(*maxShard, "--max-shard-size")
	if err != nil {
		return env.usageError("%v", err)
	}
	rec, err := openRun(*root, fs.Arg(0))
	if err != nil {
		return env.report(err)
	}
	s, err := recordSpec(rec)
	if err != nil {
		return env.report(err)
	}
	if err := locateSource(s, *name, *source, rec.ID()[:8]); err != nil {
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
	e, err := stages.ExportCheckpoint(l.job, *name, dir, *out, stages.ExportOptions{DType: *dtype, MaxShardSize: shardSize})
	if err != nil {
		if errors.Is(err, stages.ErrSourceMissing) {
			err = fmt.Errorf("%w, or pass --source DIR naming where it is now", err)
		}
		return env.report(err)
	}
	fmt.Fprintf(env.stdout, "exported %s of run %s at step %d: %s (HF checkpoint, %s)\n", *name, rec.ID()[:8], at, *out, weightFiles(e))
	printCopied(env.stdout, e)
	return exitOK
}

// locateSource points model name's source checkpoint directory (its path,
// or that of the model it is a copy of) at dir when dir is given, and every
// other model loaded from the same directory with it. Without dir, it
// refuses a source directory that no longer exists, saying how to go on:
// an export needs the source's config.json and copies its tokenizer. A
// model the spec does not have is left to the checks after resolving.
func locateSource(s *spec.Spec, name, dir, run string) error {
	models := map[string]*spec.Model{}
	for _, m := range s.Models {
		models[m.Name] = m
	}
	m := models[name]
	if m != nil && m.CopyOf != "" {
		m = models[m.CopyOf]
	}
	if m == nil || m.Path == "" {
		return nil
	}
	if dir == "" {
		if _, err := os.Stat(m.Path); errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("model %q of run %s was loaded from %s, which no longer exists: "+
				"an export needs its config.json and copies its tokenizer and other files besides the weights; "+
				"restore the directory at that path, or pass --source DIR naming where it is now", name, run, m.Path)
		}
		return nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("--source: %w", err)
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		return fmt.Errorf("--source %s: not a checkpoint directory", dir)
	}
	old := m.Path
	for _, o := range s.Models {
		if o.Path == old {
			o.Path = abs
		}
	}
	return nil
}

// weightFiles describes the weight files of an export.
func weightFiles(e *stages.Exported) string {
	if len(e.Weights) == 1 {
		return e.Weights[0]
	}
	return fmt.Sprintf("%d shards and %s", len(e.Weights)-1, e.Weights[len(e.Weights)-1])
}

// printCopied says which files an export copied from its source
// checkpoint directory.
func printCopied(w io.Writer, e *stages.Exported) {
	switch {
	case e.Source == "":
	case len(e.Copied) == 0:
		fmt.Fprintf(w, "copied no files from %s: it holds no tokenizer or other files besides config.json and the weights\n", e.Source)
	case len(e.Copied) == 1:
		fmt.Fprintf(w, "copied 1 file from %s: %s\n", e.Source, e.Copied[0])
	default:
		fmt.Fprintf(w, "copied %d files from %s: %s\n", len(e.Copied), e.Source, strings.Join(e.Copied, ", "))
	}
}
