package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/rlpipe/rlpipe/jobs"
	"github.com/rlpipe/rlpipe/jobs/report"
	"github.com/rlpipe/rlpipe/model"
)

func cmdJobs(_ context.Context, env *cli, args []string) int {
	fs := newFlagSet("jobs", "Usage: rlpipe jobs list [--runs DIR] [--json]\n       rlpipe jobs show [--runs DIR] [--json] RUN\n       rlpipe jobs report [--runs DIR] [-o FILE] RUN\n\nLists run records, or shows one: its status, metrics and checkpoints. A run\nwhose process died without recording its end shows as interrupted. RUN is\na run id, an id prefix, or the run's directory.\n\nreport writes one self-contained HTML page of a run: its training curves\n(loss, reward, KL, entropy, clipfrac, grad norm, lr, tokens/s) and its\nplanned against its measured memory, with the plan's memory timeline; by\ndefault to report.html in the run's directory.\n\n")
	root := fs.String("runs", jobs.DefaultRoot, "directory of run records")
	asJSON := fs.Bool("json", false, "print the records as JSON: list, an array of run.json records; show, the record with its dir, checkpoints and metrics")
	out := fs.String("o", "", "report: the file to write the page to (default: report.html in the run's directory)")
	if code, ok := parseFlags(fs, env, args, "list|show|report", "RUN?"); !ok {
		return code
	}
	sub := fs.Arg(0)
	if *out != "" && sub != "report" {
		return env.argError(fs, "-o is for jobs report")
	}
	if *asJSON && sub == "report" {
		return env.argError(fs, "--json is for jobs list and jobs show")
	}
	switch {
	case sub == "list" && fs.NArg() == 1:
		return jobsList(env, *root, *asJSON)
	case sub == "list":
		return env.argError(fs, "unexpected argument %q", fs.Arg(1))
	case sub == "show" && fs.NArg() == 2:
		return jobsShow(env, *root, fs.Arg(1), *asJSON)
	case sub == "report" && fs.NArg() == 2:
		return jobsReport(env, *root, fs.Arg(1), *out)
	case sub == "show" || sub == "report":
		return env.argError(fs, "missing RUN")
	default:
		return env.argError(fs, "unknown subcommand %q (list, show, report)", sub)
	}
}

// jobsReport writes the report of the run id (an id, id prefix or
// directory) under root to out, or to report.html in the run's directory.
func jobsReport(env *cli, root, id, out string) int {
	r, err := openRun(root, id)
	if err != nil {
		return env.report(err)
	}
	if out == "" {
		out = filepath.Join(r.Dir(), report.FileName)
	}
	if err := model.WriteFileAtomic(out, 0o644, func(w io.Writer) error { return report.Write(w, r) }); err != nil {
		return env.report(err)
	}
	fmt.Fprintf(env.stdout, "report of run %s written to %s\n", r.ID()[:8], out)
	return exitOK
}

// jobsList prints the run records under root.
func jobsList(env *cli, root string, asJSON bool) int {
	metas, err := jobs.List(root)
	if asJSON {
		if metas == nil {
			metas = []jobs.Meta{}
		}
		if err := writeJSON(env.stdout, metas); err != nil {
			return env.report(err)
		}
	} else {
		for _, m := range metas {
			fmt.Fprintf(env.stdout, "%-8s  %-24s  %-11s  step %d/%d  %s\n", m.ID[:8], m.Name, m.Status, m.LastStep, m.TotalSteps, m.Created.Local().Format("2006-01-02 15:04:05"))
		}
		if len(metas) == 0 && err == nil {
			fmt.Fprintf(env.stdout, "no runs under %s\n", root)
		}
	}
	if err != nil {
		fmt.Fprintf(env.stderr, "rlpipe: %v\n", err)
		return exitFailed
	}
	return exitOK
}

// jobsShow prints the run record id (an id, id prefix or directory) under
// root, with its checkpoints and metrics.
func jobsShow(env *cli, root, id string, asJSON bool) int {
	r, err := openRun(root, id)
	if err != nil {
		return env.report(err)
	}
	m := r.Meta()
	var steps []int
	if cks, err := r.Checkpoints(); err == nil {
		for _, c := range cks {
			steps = append(steps, c.Step)
		}
	}
	ms, err := r.Metrics()
	if err != nil && !errors.Is(err, jobs.ErrTruncatedMetrics) {
		return env.report(err)
	}
	if asJSON {
		out := runJSON{Meta: m, Dir: r.Dir(), Checkpoints: append([]int{}, steps...), Metrics: append([]jobs.Metrics{}, ms...)}
		if err := writeJSON(env.stdout, out); err != nil {
			return env.report(err)
		}
		return exitOK
	}
	fmt.Fprintf(env.stdout, "run      %s\nname     %s\nspec     %s\nstatus   %s\nsteps    %d/%d\nseed     %d\ncreated  %s\ndir      %s\n",
		m.ID, m.Name, m.SpecPath, m.Status, m.LastStep, m.TotalSteps, m.Seed, m.Created.Local().Format(time.RFC3339), r.Dir())
	if m.Error != "" {
		fmt.Fprintf(env.stdout, "error    %s\n", m.Error)
	}
	if len(steps) > 0 {
		fmt.Fprintf(env.stdout, "ckpts    steps %s\n", strings.Trim(strings.Join(strings.Fields(fmt.Sprint(steps)), ", "), "[]"))
	}
	if m.Exported != "" {
		fmt.Fprintf(env.stdout, "export   %s (step %d)\n", m.Exported, m.ExportedStep)
	}
	if len(ms) > 0 {
		fmt.Fprintf(env.stdout, "\n%5s %7s %10s %10s %10s %10s %9s %9s %10s\n", "step", "updates", "loss", "pg_loss", "kl", "entropy", "grad_norm", "lr", "tok/s")
		for _, x := range ms {
			fmt.Fprintf(env.stdout, "%5d %7d %10.4g %10.4g %10.4g %10.4g %9.4g %9.3g %10.0f\n", x.Step, x.Updates, x.Loss, x.PGLoss, x.KL, x.Entropy, x.GradNorm, x.LR, x.TokensPerS)
		}
		if extra := ms[len(ms)-1].Extra; len(extra) > 0 {
			keys := make([]string, 0, len(extra))
			for k := range extra {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			var parts []string
			for _, k := range keys {
				parts = append(parts, fmt.Sprintf("%s=%.4g", k, extra[k]))
			}
			fmt.Fprintf(env.stdout, "last step: %s\n", strings.Join(parts, " "))
		}
	}
	return exitOK
}
