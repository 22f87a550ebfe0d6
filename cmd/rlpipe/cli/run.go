package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/rlpipe/rlpipe/jobs"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
	"github.com/rs/zerolog"
)

func cmdRun(ctx context.Context, env *cli, args []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(env.stderr, `Usage: rlpipe run [flags] SPEC.yaml
       rlpipe run [flags] --resume RUN

Runs the job: setup stages once, then the step stages for every training
step, with one in-process rank per dp rank: on the CUDA backend when a GPU
is found, one GPU per rank connected by NCCL, and on the CPU backend
otherwise, connected through shared memory. Each run gets
a directory under --runs with the spec, the resolved spec, the plan, a log,
metrics.jsonl, checkpoints and, at the end, the actor exported as an HF
checkpoint. --resume continues a run from its latest checkpoint.

`)
		fs.PrintDefaults()
	}
	g := gpuFlag(fs)
	backend := backendFlag(fs)
	root := fs.String("runs", jobs.DefaultRoot, "directory of run records")
	resume := fs.String("resume", "", "resume the run with this id (or id prefix) from its latest checkpoint")
	steps := fs.Int("steps", 0, "stop after this step (default train.steps)")
	exportModel := fs.String("export", "actor", "model to export as an HF checkpoint at the end (empty: none)")
	exportDType := fs.String("export-dtype", "", "dtype of the exported weights: bf16, fp16, fp32 (default: the config's)")
	if code, ok := parseFlags(fs, env, args); !ok {
		return code
	}
	var specPath string
	var rec *jobs.Run
	first := 1
	switch {
	case *resume != "" && fs.NArg() == 0:
		r, err := jobs.Open(*root, *resume)
		if err != nil {
			return env.report(err)
		}
		specPath = r.Meta().SpecPath
		rec = r
	case *resume == "" && fs.NArg() == 1:
		specPath = fs.Arg(0)
	default:
		fs.Usage()
		return exitUsage
	}
	l, err := load(specPath, *g)
	if err != nil {
		return env.report(err)
	}
	if err := l.job.CheckRunnable(); err != nil {
		return env.report(err)
	}
	choice, err := chooseBackend(*backend, l.spec)
	if err != nil {
		return env.report(err)
	}
	p, err := stages.Plan(l.job)
	if err != nil {
		return env.report(err)
	}
	if !p.Fits(l.job.GPU.Bytes) {
		fmt.Fprintf(env.stderr, "rlpipe: the plan needs %s GiB per device and %s has %s GiB; see `rlpipe plan %s`\n",
			plan.GiB(p.DeviceTotal()), l.job.GPU.Name, plan.GiB(l.job.GPU.Bytes), specPath)
		return exitNoFit
	}
	data, err := stages.ReadData(l.job)
	if err != nil {
		return env.report(err)
	}
	specBytes, err := os.ReadFile(specPath)
	if err != nil {
		return env.report(err)
	}
	total, stopAt := l.spec.Train.Steps, l.spec.Train.Steps
	if *steps > 0 {
		stopAt = min(*steps, total)
	}
	if rec == nil {
		rec, err = jobs.Create(*root, jobs.Meta{Name: l.spec.Name, SpecPath: specPath, TotalSteps: total, Version: version})
		if err != nil {
			return env.report(err)
		}
		if err := writeRecords(rec, specBytes, l, p); err != nil {
			return env.report(err)
		}
	} else {
		saved, err := rec.ReadFile(jobs.SpecFile)
		if err != nil {
			return env.report(err)
		}
		if string(saved) != string(specBytes) {
			return env.report(fmt.Errorf("%s changed since run %s started; resume needs the same spec", specPath, rec.ID()))
		}
		if err := rec.SetTotalSteps(total); err != nil {
			return env.report(err)
		}
	}
	defer rec.Close()
	var resumeDir string
	if *resume != "" {
		step, dir, ok, err := rec.Resume()
		if err != nil {
			return env.report(err)
		}
		if ok {
			first, resumeDir = step+1, dir
		}
	}
	logf, err := rec.LogFile()
	if err != nil {
		return env.report(err)
	}
	defer logf.Close()
	log := zerolog.New(zerolog.MultiLevelWriter(logWriter(env), logf)).With().Timestamp().Str("run", rec.ID()[:8]).Logger()
	log.Info().Str("dir", rec.Dir()).Str("spec", specPath).Str("backend", choice.name).Int("ranks", l.spec.Mesh.DP).Int("first_step", first).Int("steps", total).
		Str("arena", plan.GiB(p.DeviceArena)+" GiB").Msg("run started")

	prog := jobs.NewProgress(env.stderr, total, isTerminal(env.stderr))
	if first > stopAt {
		return env.report(fmt.Errorf("run %s is already past step %d", rec.ID()[:8], stopAt))
	}
	opts := stages.RunOptions{FirstStep: first, Steps: stopAt, Export: *exportModel, Backend: choice.newBackend, Comms: choice.comms}
	if resumeDir != "" {
		opts.Resume = func(r *stages.Rank) error { return r.LoadShards(resumeDir) }
	}
	every := l.spec.Train.CheckpointEvery
	opts.AfterStep = func(r *stages.Rank, sr stages.StepResult) error {
		save := sr.Step == stopAt || (every > 0 && sr.Step%every == 0)
		if r.ID == 0 {
			m := metricsOf(sr)
			if choice.name == "cuda" {
				if n, ok := deviceMemory(0); ok {
					m.Extra["nvml_bytes"] = float64(n)
				}
			}
			if err := rec.AppendMetrics(m); err != nil {
				return err
			}
			prog.Update(sr.Step, jobs.F("loss", m.Loss), jobs.F("adv_logp", m.Extra["adv_logp"]), jobs.F("kl", m.KL),
				jobs.F("grad_norm", m.GradNorm), jobs.F("lr", m.LR), jobs.F(jobs.FieldTokensPerS, m.TokensPerS))
			log.Debug().Int("step", sr.Step).Float64("loss", m.Loss).Float64("tok/s", m.TokensPerS).Msg("step")
		}
		if !save {
			return nil
		}
		return checkpoint(ctx, rec, r, sr.Step)
	}
	res, err := stages.Run(ctx, l.job, l.graph, p, data, opts)
	prog.Done()
	if err != nil {
		status := jobs.StatusFailed
		if errors.Is(err, context.Canceled) {
			status = jobs.StatusCanceled
		}
		_ = rec.SetStatus(status, err)
		log.Error().Err(err).Msg("run failed")
		fmt.Fprintf(env.stderr, "rlpipe: run %s failed: %v\n", rec.ID()[:8], err)
		if status == jobs.StatusCanceled {
			return exitCanceled
		}
		return exitFailed
	}
	var exported string
	if *exportModel != "" {
		exported = filepath.Join(rec.Dir(), "export", *exportModel)
		if err := stages.ExportHF(l.job.Models[*exportModel], l.spec.Mesh.DP, res.Export, exported, *exportDType); err != nil {
			_ = rec.SetStatus(jobs.StatusFailed, err)
			return env.report(err)
		}
	}
	final := jobs.StatusSucceeded
	if stopAt < total {
		final = jobs.StatusStopped
	}
	if err := rec.SetStatus(final, nil); err != nil {
		return env.report(err)
	}
	hw, _ := res.Ranks[0].Arena.HighWater()
	fmt.Fprintf(env.stdout, "run %s %s: steps %d-%d of %d, arena high-water %d bytes (planned peak %d)\n", rec.ID()[:8], final, first, stopAt, total, hw, p.PeakBytes)
	fmt.Fprintf(env.stdout, "  record:  %s\n", rec.Dir())
	if exported != "" {
		fmt.Fprintf(env.stdout, "  export:  %s (HF checkpoint)\n", exported)
	}
	return exitOK
}

// checkpoint saves every rank's shards at step and commits the checkpoint
// once all ranks have written.
func checkpoint(ctx context.Context, rec *jobs.Run, r *stages.Rank, step int) error {
	var dir string
	var err error
	if r.ID == 0 {
		if dir, err = rec.CheckpointDir(step); err != nil {
			return err
		}
	}
	if err := r.Comm.Barrier(ctx); err != nil {
		return err
	}
	if r.ID != 0 {
		dir = filepath.Join(rec.Dir(), jobs.CheckpointsDir, fmt.Sprintf("step-%d", step))
	}
	if err := r.SaveShards(dir); err != nil {
		return err
	}
	if err := r.Comm.Barrier(ctx); err != nil {
		return err
	}
	if r.ID == 0 {
		return rec.CommitCheckpoint(step)
	}
	return nil
}

// metricsOf turns a step result into the run record's metrics line.
func metricsOf(sr stages.StepResult) jobs.Metrics {
	v := sr.Stats.Values
	m := jobs.Metrics{Step: sr.Step, WallS: sr.Wall.Seconds(), Loss: v["loss"], PGLoss: v["pg_loss"], KL: v["kl_loss"],
		Entropy: v["entropy_loss"], ClipFrac: v["pg_clipfrac"], GradNorm: sr.Stats.GradNorm, LR: sr.Stats.LR,
		Tokens: sr.Tokens, PeakMemBytes: sr.InUse, Extra: map[string]float64{}}
	if s := sr.Wall.Seconds(); s > 0 {
		m.TokensPerS = float64(sr.Tokens) / s
	}
	known := map[string]bool{"loss": true, "pg_loss": true, "kl_loss": true, "entropy_loss": true, "pg_clipfrac": true}
	for k, x := range v {
		if !known[k] {
			m.Extra[k] = x
		}
	}
	return m
}

// writeRecords stores the spec, the resolved spec and the plan in the run record.
func writeRecords(rec *jobs.Run, specBytes []byte, l *loaded, p *plan.Plan) error {
	if err := rec.WriteSpec(specBytes); err != nil {
		return err
	}
	if err := rec.WriteResolved(resolved(l)); err != nil {
		return err
	}
	return rec.WritePlan(p)
}

// resolved is the spec with every default filled in, as JSON.
func resolved(l *loaded) any {
	type model struct {
		Name, Role, Path, CopyOf, Family string
		Params                           int64
		Offload, OffloadOptimizer        bool
	}
	type stage struct {
		ID, Uses, Phase, When string
		Needs                 []string
		With                  stages.Stage
	}
	out := struct {
		Name     string
		Models   []model
		Mesh     spec.Mesh
		Data     spec.Data
		Train    spec.Train
		Policies map[string]string
		GPU      stages.GPU
		Stages   []stage
	}{Name: l.spec.Name, Mesh: l.spec.Mesh, Data: l.spec.Data, Train: l.spec.Train, GPU: l.job.GPU, Policies: map[string]string{}}
	for _, sm := range l.spec.Models {
		m := l.job.Models[sm.Name]
		out.Models = append(out.Models, model{sm.Name, sm.Role, sm.Path, sm.CopyOf, string(m.Config.Family), m.Config.NumParams(), m.Offload, m.OffloadOptimizer})
	}
	pol := l.spec.Policies
	for k, e := range map[string]*spec.Expr{"offload": pol.Offload, "offload_optimizer": pol.OffloadOptimizer, "precision": pol.Precision, "recompute": pol.Recompute} {
		if e != nil {
			out.Policies[k] = e.Src
		}
	}
	for _, st := range l.job.Order {
		s := stage{ID: st.ID, Uses: st.Uses, Phase: string(st.Phase), With: l.job.Stages[st.ID]}
		if st.When != nil {
			s.When = st.When.Src
		}
		for _, n := range st.Needs {
			s.Needs = append(s.Needs, n.Name)
		}
		out.Stages = append(out.Stages, s)
	}
	return out
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && jobs.IsTerminal(f)
}

// logWriter writes warnings and errors to the terminal (console format on a
// terminal, JSON otherwise); the run log gets everything.
func logWriter(env *cli) io.Writer {
	var w io.Writer = env.stderr
	if isTerminal(env.stderr) {
		w = zerolog.ConsoleWriter{Out: env.stderr, TimeFormat: time.TimeOnly}
	}
	return &zerolog.FilteredLevelWriter{Writer: zerolog.LevelWriterAdapter{Writer: w}, Level: zerolog.WarnLevel}
}

func cmdJobs(_ context.Context, env *cli, args []string) int {
	fs := flag.NewFlagSet("jobs", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(env.stderr, "Usage: rlpipe jobs list [--runs DIR]\n       rlpipe jobs show [--runs DIR] RUN\n\nLists run records, or shows one: its status, metrics and checkpoints.\n\n")
		fs.PrintDefaults()
	}
	root := fs.String("runs", jobs.DefaultRoot, "directory of run records")
	if len(args) == 0 {
		fs.Usage()
		return exitUsage
	}
	sub := args[0]
	if code, ok := parseFlags(fs, env, args[1:]); !ok {
		return code
	}
	switch {
	case sub == "list" && fs.NArg() == 0:
		metas, err := jobs.List(*root)
		for _, m := range metas {
			fmt.Fprintf(env.stdout, "%-8s  %-24s  %-9s  step %d/%d  %s\n", m.ID[:8], m.Name, m.Status, m.LastStep, m.TotalSteps, m.Created.Local().Format("2006-01-02 15:04:05"))
		}
		if len(metas) == 0 && err == nil {
			fmt.Fprintf(env.stdout, "no runs under %s\n", *root)
		}
		if err != nil {
			fmt.Fprintf(env.stderr, "rlpipe: %v\n", err)
			return exitFailed
		}
		return exitOK
	case sub == "show" && fs.NArg() == 1:
		r, err := jobs.Open(*root, fs.Arg(0))
		if err != nil {
			return env.report(err)
		}
		m := r.Meta()
		fmt.Fprintf(env.stdout, "run      %s\nname     %s\nspec     %s\nstatus   %s\nsteps    %d/%d\ncreated  %s\ndir      %s\n",
			m.ID, m.Name, m.SpecPath, m.Status, m.LastStep, m.TotalSteps, m.Created.Local().Format(time.RFC3339), r.Dir())
		if m.Error != "" {
			fmt.Fprintf(env.stdout, "error    %s\n", m.Error)
		}
		if cks, err := r.Checkpoints(); err == nil && len(cks) > 0 {
			var steps []string
			for _, c := range cks {
				steps = append(steps, fmt.Sprint(c.Step))
			}
			fmt.Fprintf(env.stdout, "ckpts    steps %s\n", strings.Join(steps, ", "))
		}
		ms, err := r.Metrics()
		if err != nil && !errors.Is(err, jobs.ErrTruncatedMetrics) {
			return env.report(err)
		}
		if len(ms) > 0 {
			fmt.Fprintf(env.stdout, "\n%5s %10s %10s %10s %10s %9s %9s %10s\n", "step", "loss", "pg_loss", "kl", "entropy", "grad_norm", "lr", "tok/s")
			for _, x := range ms {
				fmt.Fprintf(env.stdout, "%5d %10.4g %10.4g %10.4g %10.4g %9.4g %9.3g %10.0f\n", x.Step, x.Loss, x.PGLoss, x.KL, x.Entropy, x.GradNorm, x.LR, x.TokensPerS)
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
	default:
		fs.Usage()
		return exitUsage
	}
}
