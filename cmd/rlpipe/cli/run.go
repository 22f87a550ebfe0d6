package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/rlpipe/rlpipe/jobs"
	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
	"github.com/rs/zerolog"
)

func cmdRun(ctx context.Context, env *cli, args []string) int {
	fs := newFlagSet("run", `Usage: rlpipe run [flags] SPEC.yaml
       rlpipe run [flags] --resume RUN

Runs the job: setup stages once, then the step stages for every training
step, with one in-process rank per dp rank: on the CUDA backend when a GPU
is found, one GPU per rank connected by NCCL, and on the CPU backend
otherwise, connected through shared memory. Started by a launcher
(torchrun, a Kubernetes PyTorchJob or JobSet, srun), it runs one rank per
process, on one host or several, and joins the others; see
docs/running.md, "A process per rank" (RLPIPE_PORT, RLPIPE_JOIN_TIMEOUT).

Each run gets a directory under --runs with the spec, the resolved spec,
the plan, a log, metrics.jsonl (a line per step), updates.jsonl (a line
per optimizer update), checkpoints and, at the end, the model exported as
an HF checkpoint.

--resume continues a run from its latest checkpoint with the copy of the
spec in its record, from any directory: RUN is a run id, an id prefix, or
the run's directory. A run whose training finished but whose export did
not is resumed to write the export. SIGINT or SIGTERM stops a run after
its current step, with a checkpoint; a second signal aborts at once.

As it runs it shows the setup's progress (models loaded and sharded),
then the steps' with their RL metrics: a line redrawn in place on a
terminal, plain lines otherwise. --json prints the run's events instead,
as JSON lines on stdout (run started, setup stage started, progress and
finished, setup finished, step, checkpoint snapshot taken and saved,
export written, run finished, run failed, run stopped by a signal): the
events the run log records; see docs/running.md.

--timeline K records the timeline of every K-th step, without syncing
the device: when each op ran on rank 0, when its side stream gathered and
reduced, and how long its compute stream waited for that. Each goes to
the run's timeline/step-NNNNNN.json, a Chrome trace (chrome://tracing,
Perfetto), and the step's waits into the run log's step event.

`)
	g := gpuFlag(fs)
	backend := backendFlag(fs)
	root := fs.String("runs", jobs.DefaultRoot, "directory of run records")
	resume := fs.String("resume", "", "resume the run with this id, id prefix or directory from its latest checkpoint")
	steps := fs.Int("steps", 0, "stop after this step, 1 to train.steps (0: train.steps)")
	exportModel := fs.String("export", "actor", "model to export as an HF checkpoint at the end (empty: none)")
	exportDType := fs.String("export-dtype", "", "dtype of the exported weights: bf16, fp16, fp32 (default: the config's)")
	asJSON := fs.Bool("json", false, "print the run's events as JSON lines on stdout instead of the progress display")
	timelineEvery := fs.Int("timeline", 0, "record every K-th step's timeline (rank 0's ops and side-stream gathers and reductions, unsynced) into the run's timeline/ as Chrome traces (0: none)")
	if code, ok := parseFlags(fs, env, args, "SPEC.yaml?"); !ok {
		return code
	}
	if *timelineEvery < 0 {
		return env.usageError("--timeline: %d is not a step interval (0: none)", *timelineEvery)
	}
	switch {
	case *resume == "" && fs.NArg() == 0:
		return env.argError(fs, "missing SPEC.yaml (or --resume RUN)")
	case *resume != "" && fs.NArg() == 1:
		return env.argError(fs, "give SPEC.yaml or --resume RUN, not both")
	}
	if err := checkRunFlags(*g, *backend, *steps, *exportDType); err != nil {
		return env.usageError("%v", err)
	}
	proc, err := launched()
	if err != nil {
		return env.usageError("%v", err)
	}
	var (
		s   *spec.Spec
		rec *jobs.Run
	)
	specPath := fs.Arg(0)
	if *resume != "" {
		if rec, err = openRun(*root, *resume); err != nil {
			return env.report(err)
		}
		if s, err = recordSpec(rec); err != nil {
			return env.report(err)
		}
		specPath = s.File
		if proc.rank() != 0 { // rank 0 alone writes the record
			rec.Close()
			rec = nil
		}
	} else if s, err = spec.Load(specPath); err != nil {
		return env.report(err)
	}
	l, err := resolveSpec(s, *g, stages.CheckRun)
	if err != nil {
		return env.report(err)
	}
	if err := checkExportModel(l.job, *exportModel); err != nil {
		return env.usageError("%v", err)
	}
	if *steps > l.spec.Train.Steps {
		return env.usageError("--steps %d: beyond the spec's train.steps (%d) of %s; raise train.steps to train longer", *steps, l.spec.Train.Steps, specPath)
	}
	if proc != nil {
		if err := proc.check(l.spec); err != nil {
			return env.report(err)
		}
	}
	choice, err := chooseBackend(*backend, l.spec, proc)
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
	if ram, err := hostMemory(); err == nil && choice.name == "cuda" && !p.FitsHost(l.spec.Mesh.GPUsPerNode, ram) {
		// On the CPU backend the arena is host memory, checked above.
		fmt.Fprintf(env.stderr, "rlpipe: the plan needs %s GiB of host memory for the %d rank(s) of a node and this host has %s GiB; see `rlpipe plan --host-memory %d %s`\n",
			plan.GiB(p.HostPerNode(l.spec.Mesh.GPUsPerNode)), l.spec.Mesh.GPUsPerNode, plan.GiB(ram), ram, specPath)
		return exitNoFit
	}
	total, stopAt := l.spec.Train.Steps, l.spec.Train.Steps
	if *steps > 0 {
		stopAt = *steps
	}
	if proc != nil {
		if err := proc.join(ctx); err != nil {
			return env.report(err)
		}
		defer proc.close()
	}
	info := runInfo{First: 1}
	if proc.rank() == 0 {
		rec, info, err = startRecord(*root, rec, specPath, l, p, stopAt)
		if err != nil {
			info.Err = err.Error()
		}
	}
	info, serr := proc.share(ctx, info)
	switch {
	case err != nil:
		return env.report(err)
	case serr != nil:
		return env.report(fmt.Errorf("%s%w", proc.who(), serr))
	case info.Err != "":
		return env.report(fmt.Errorf("%srank 0 could not start the run: %s", proc.who(), info.Err))
	}
	if rec != nil {
		defer rec.Close()
	}
	first := info.First
	// Human messages go to stderr; with --json, stdout carries the run's
	// events alone.
	human, events := env.stdout, io.Discard
	if *asJSON {
		human, events = env.stderr, zerolog.SyncWriter(env.stdout)
	}
	var logf io.Writer
	if rec != nil {
		f, err := rec.LogFile()
		if err != nil {
			return env.report(err)
		}
		defer f.Close()
		logf = f
	}
	log, quiet := runLoggers(env, logf, events, rec, proc)
	if info.Skip {
		if rec == nil {
			return exitOK // rank 0 writes the export
		}
		return env.finishExport(rec, l, runOutput{log, quiet, human}, *exportModel, *exportDType)
	}
	opts := stages.RunOptions{FirstStep: first, Steps: stopAt, Backend: choice.newBackend, Comms: choice.comms, CPComms: choice.cpComms, Stop: env.stop.Load,
		TimelineEvery: *timelineEvery}
	if proc != nil {
		opts.Ranks, opts.Control = []int{proc.rank()}, []nccl.Comm{proc.ctl}
		// The host's cores are shared by the processes on it.
		opts.Threads = max(1, runtime.GOMAXPROCS(0)/max(1, proc.w.LocalSize))
	}
	devices := choice.describe(opts.Threads, l.spec.Mesh.WorldSize())
	if rec != nil {
		announce(env.stderr, rec, l, p, choice.name, devices, first, stopAt, total)
		if notice := fallbackNotice(choice, l.job.GPU); notice != "" {
			fmt.Fprintf(env.stderr, "rlpipe: warning: %s\n", notice)
			quiet.Warn().Str("event", "backend_fallback").Str("gpu", l.job.GPU.Name).Msg(notice)
		}
	}
	started := time.Now()
	idFull := ""
	if rec != nil {
		idFull = rec.ID()
	}
	log.Info().Str("event", "run_started").Str("id", idFull).Str("dir", info.Dir).Str("spec", specPath).Str("backend", choice.name).Str("devices", devices).
		Int("ranks", l.spec.Mesh.WorldSize()).Int("processes", max(1, proc.size())).Int("first_step", first).Int("last_step", stopAt).Int("steps", total).
		Int("updates_per_step", l.spec.UpdatesPerStep()).Int64("seed", l.spec.Train.Seed).Str("arena", plan.GiB(p.DeviceArena)+" GiB").Msg("run started")

	// Rank 0's process shows the progress, on stderr unless --json.
	progOut, showBar := env.stderr, isTerminal(env.stderr)
	if rec == nil || *asJSON {
		progOut, showBar = io.Discard, false
	}
	prog := jobs.NewProgress(progOut, total, showBar)
	var setup *jobs.SetupProgress
	if rec != nil {
		local := l.spec.Mesh.WorldSize()
		if proc != nil {
			local = 1
		}
		setup = jobs.NewSetupProgress(progOut, setupStages(l.job), local, showBar)
		opts.Progress = setupReporter(log, setup, prog, local)
	}
	if info.ResumeDir != "" {
		opts.Resume = func(r *stages.Rank) error { return r.LoadShards(info.ResumeDir) }
	}
	opts.DeviceMemory = choice.deviceMemory
	every := l.spec.Train.CheckpointEvery
	saves := &saver{async: l.spec.Train.CheckpointAsync, rec: rec, runDir: info.Dir, log: log, pending: map[int]*pendingSave{}}
	var tokens int64 // rank 0's steps' tokens
	opts.AfterStep = func(r *stages.Rank, sr stages.StepResult) error {
		save := sr.Step == stopAt || (every > 0 && sr.Step%every == 0) || sr.Stop
		if r.ID == 0 {
			m, err := recordStep(rec, sr, choice.name == "cuda")
			if err != nil {
				return err
			}
			tokens += m.Tokens
			prog.Update(sr.Step, stepFields(m)...)
			line, err := json.Marshal(m)
			if err != nil {
				return err
			}
			ev := log.Info().Str("event", "step").Int("step", sr.Step).RawJSON("metrics", line)
			if sr.Timeline != nil {
				path, err := writeTimeline(info.Dir, sr)
				if err != nil {
					return err
				}
				ev = ev.Str("timeline", path).Dict("timeline_wait_s", timelineWaits(sr.Timeline))
				if len(sr.Timeline.Idle) > 0 {
					ev = ev.Dict("timeline_idle_s", timelineIdle(sr.Timeline))
				}
			}
			ev.Msg("step")
		}
		if got, ok := sr.Stats.Values["asleep_device_bytes"]; ok && got > sr.Stats.Values["asleep_plan_bytes"] {
			log.Warn().Int("step", sr.Step).Int("rank", r.ID).Str("nvml", plan.GiB(int64(got))+" GiB").Str("plan", plan.GiB(int64(sr.Stats.Values["asleep_plan_bytes"]))+" GiB").
				Msg("while the trainer slept, the process held more device memory than the plan keeps")
		}
		return saves.afterStep(ctx, r, sr.Step, save, sr.Step == stopAt || sr.Stop)
	}
	env.graceful.Store(true)
	res, err := stages.Run(ctx, l.job, p, opts)
	env.graceful.Store(false)
	if setup != nil {
		setup.Done() // a setup that failed leaves its line drawn
	}
	prog.Done()
	if err != nil {
		status := jobs.StatusFailed
		if errors.Is(err, context.Canceled) {
			status = jobs.StatusCanceled
		}
		quiet.Error().Str("event", "run_failed").Str("status", string(status)).Err(err).Msg("run failed") // printed once, below
		if rec != nil {
			_ = rec.SetStatus(status, err)
			fmt.Fprintf(env.stderr, "rlpipe: %srun %s failed: %v\n", proc.who(), rec.ID()[:8], err)
		} else {
			fmt.Fprintf(env.stderr, "rlpipe: %srun failed: %v\n", proc.who(), err)
		}
		if status == jobs.StatusCanceled {
			return exitCanceled
		}
		return exitFailed
	}
	if res.Last < stopAt {
		if rec == nil {
			return exitCanceled
		}
		err := fmt.Errorf("stopped by a signal after step %d, with a checkpoint; resume with rlpipe run --resume %s", res.Last, rec.ID()[:8])
		_ = rec.SetStatus(jobs.StatusStopped, err)
		log.Warn().Str("event", "run_stopped").Int("step", res.Last).Int("first_step", first).Float64("seconds", time.Since(started).Seconds()).Int64("tokens", tokens).Msg("run stopped by a signal")
		fmt.Fprintf(human, "run %s stopped: steps %d-%d of %d (%v)\n  record:  %s\n", rec.ID()[:8], first, res.Last, total, err, rec.Dir())
		return exitCanceled
	}
	if rec == nil {
		return exitOK // rank 0 reports the run and writes the export
	}
	hw, _ := res.Ranks[0].Arena.HighWater()
	var exported string
	if *exportModel != "" {
		// From the last step's checkpoint, streamed: every rank wrote its
		// shard there, and the export holds one tensor in memory at a time.
		// The ranks' host buffers are garbage now; their pages go back
		// before the export takes its own.
		res = nil
		debug.FreeOSMemory()
		exported = filepath.Join(rec.Dir(), "export", *exportModel)
		t0 := time.Now()
		if _, err := stages.ExportCheckpoint(l.job, *exportModel, checkpointPath(rec.Dir(), stopAt), exported, stages.ExportOptions{DType: *exportDType}); err != nil {
			_ = rec.SetStatus(jobs.StatusFailed, err)
			quiet.Error().Str("event", "run_failed").Str("status", string(jobs.StatusFailed)).Err(err).Msg("run failed") // printed once, by report
			return env.report(err)
		}
		if err := rec.SetExported(exported); err != nil {
			return env.report(err)
		}
		log.Info().Str("event", "export_written").Str("model", *exportModel).Int("step", stopAt).Str("dir", exported).Float64("seconds", time.Since(t0).Seconds()).Msg("export written")
	}
	final := jobs.StatusSucceeded
	if stopAt < total {
		final = jobs.StatusStopped
	}
	if err := rec.SetStatus(final, nil); err != nil {
		return env.report(err)
	}
	log.Info().Str("event", "run_finished").Str("status", string(final)).Int("first_step", first).Int("last_step", stopAt).Int("steps", total).
		Float64("seconds", time.Since(started).Seconds()).Int64("tokens", tokens).Int64("high_water_bytes", hw).Int64("planned_peak_bytes", p.PeakBytes).Str("export", exported).Msg("run finished")
	fmt.Fprintf(human, "run %s %s: steps %d-%d of %d, arena high-water %d bytes (planned peak %d)\n", rec.ID()[:8], final, first, stopAt, total, hw, p.PeakBytes)
	fmt.Fprintf(human, "  record:  %s\n", rec.Dir())
	if exported != "" {
		fmt.Fprintf(human, "  export:  %s (HF checkpoint)\n", exported)
	}
	return exitOK
}

// startRecord creates the run's record (rec nil), or takes up the resumed
// one, and says where the run starts.
func startRecord(root string, rec *jobs.Run, specPath string, l *loaded, p *plan.Plan, stopAt int) (*jobs.Run, runInfo, error) {
	info := runInfo{First: 1}
	if rec == nil {
		specBytes, err := os.ReadFile(specPath)
		if err != nil {
			return nil, info, err
		}
		dir, err := filepath.Abs(filepath.Dir(specPath))
		if err != nil {
			return nil, info, err
		}
		rec, err = jobs.Create(root, jobs.Meta{Name: l.spec.Name, SpecPath: specPath, SpecDir: dir, TotalSteps: l.spec.Train.Steps, Seed: l.spec.Train.Seed, Version: version})
		if err != nil {
			return nil, info, err
		}
		if err := writeRecords(rec, specBytes, l, p); err != nil {
			return rec, info, err
		}
	} else {
		step, dir, ok, err := rec.Resume()
		if err != nil {
			return rec, info, err
		}
		if ok {
			info.First, info.ResumeDir = step+1, dir
		}
		if err := rec.SetVersion(version); err != nil {
			return rec, info, err
		}
	}
	info.Dir = rec.Dir()
	info.Skip = info.First > stopAt
	return rec, info, nil
}

// checkRunFlags reports a flag value run cannot take (exit code 2).
func checkRunFlags(gpuValue, backend string, steps int, exportDType string) error {
	if err := checkGPUFlag(gpuValue); err != nil {
		return err
	}
	switch backend {
	case "auto", "cpu", "cuda":
	default:
		return fmt.Errorf("--backend: unknown backend %q (cpu, cuda, auto)", backend)
	}
	if steps < 0 {
		return fmt.Errorf("--steps %d: must be at least 1 (0, the default, runs train.steps)", steps)
	}
	if exportDType != "" {
		if _, err := stages.ExportDType(exportDType); err != nil {
			return fmt.Errorf("--export-dtype: %w", err)
		}
	}
	return nil
}

// checkExportModel reports an --export model the job does not shard.
func checkExportModel(j *stages.Job, name string) error {
	if name == "" {
		return nil
	}
	var sharded []string
	for _, st := range j.Order {
		if a, ok := j.Stages[st.ID].(*stages.ApplyFSDP2); ok {
			if a.Model == name {
				return nil
			}
			sharded = append(sharded, a.Model)
		}
	}
	return fmt.Errorf("--export: no apply_fsdp2 stage shards model %q (sharded: %s)", name, strings.Join(sharded, ", "))
}

// openRun opens the run named by arg: a path to a run directory, or an id
// or id prefix under root.
func openRun(root, arg string) (*jobs.Run, error) {
	if st, err := os.Stat(filepath.Join(arg, jobs.MetaFile)); err == nil && !st.IsDir() {
		dir := filepath.Clean(arg)
		return jobs.Open(filepath.Dir(dir), filepath.Base(dir))
	}
	return jobs.Open(root, arg)
}

// recordSpec parses the run record's copy of its spec, resolving relative
// paths against the directory of the original spec file (or, for records
// that predate it, against the original path as given).
func recordSpec(rec *jobs.Run) (*spec.Spec, error) {
	data, err := rec.ReadFile(jobs.SpecFile)
	if err != nil {
		return nil, err
	}
	m := rec.Meta()
	path := m.SpecPath
	if m.SpecDir != "" {
		path = filepath.Join(m.SpecDir, filepath.Base(m.SpecPath))
	}
	return spec.Parse(path, data)
}

// finishExport writes the export of a run whose training finished (its
// latest checkpoint is at the last step) but whose export did not, from
// that checkpoint's files.
func (env *cli) finishExport(rec *jobs.Run, l *loaded, out runOutput, name, dtype string) int {
	step, dir, pending, err := rec.PendingExport()
	if err != nil {
		return env.report(err)
	}
	if !pending && dir == "" {
		return env.report(fmt.Errorf("run %s is already past step %d and has no checkpoint of its last step to export", rec.ID()[:8], l.spec.Train.Steps))
	}
	var exported string
	if name != "" && pending {
		exported = filepath.Join(rec.Dir(), "export", name)
		t0 := time.Now()
		if _, err := stages.ExportCheckpoint(l.job, name, dir, exported, stages.ExportOptions{DType: dtype}); err != nil {
			_ = rec.SetStatus(jobs.StatusFailed, err)
			out.quiet.Error().Str("event", "run_failed").Str("status", string(jobs.StatusFailed)).Err(err).Msg("run failed") // printed once, by report
			return env.report(err)
		}
		if err := rec.SetExported(exported); err != nil {
			return env.report(err)
		}
		out.log.Info().Str("event", "export_written").Str("model", name).Int("step", step).Str("dir", exported).Float64("seconds", time.Since(t0).Seconds()).Msg("export written")
	}
	if err := rec.SetStatus(jobs.StatusSucceeded, nil); err != nil {
		return env.report(err)
	}
	out.log.Info().Str("event", "run_finished").Str("status", string(jobs.StatusSucceeded)).Int("last_step", step).Str("export", exported).Msg("run finished")
	fmt.Fprintf(out.human, "run %s succeeded: training had finished at step %d\n  record:  %s\n", rec.ID()[:8], step, rec.Dir())
	if exported != "" {
		fmt.Fprintf(out.human, "  export:  %s (HF checkpoint, from checkpoint step %d)\n", exported, step)
	}
	return exitOK
}

// runOutput is where a run reports. log writes the run's events to the
// terminal (warnings and errors), the run log (everything) and, with
// --json, stdout (info and above); quiet writes them to the last two
// alone, for what the CLI prints itself; human takes the summary lines
// (stdout, or stderr with --json).
type runOutput struct {
	log, quiet zerolog.Logger
	human      io.Writer
}

// runLoggers returns the loggers of runOutput. file is the run log (rank
// 0's process; nil on the others, which log warnings and errors alone)
// and events the JSON lines of --json (io.Discard without).
func runLoggers(env *cli, file, events io.Writer, rec *jobs.Run, proc *process) (log, quiet zerolog.Logger) {
	if file == nil {
		log = zerolog.New(zerolog.MultiLevelWriter(logWriter(env), events)).Level(zerolog.WarnLevel).With().Timestamp().Int("rank", proc.rank()).Logger()
		quiet = zerolog.New(events).Level(zerolog.WarnLevel).With().Timestamp().Int("rank", proc.rank()).Logger()
		return log, quiet
	}
	jsonLines := &zerolog.FilteredLevelWriter{Writer: zerolog.LevelWriterAdapter{Writer: events}, Level: zerolog.InfoLevel}
	log = zerolog.New(zerolog.MultiLevelWriter(logWriter(env), file, jsonLines)).With().Timestamp().Str("run", rec.ID()[:8]).Logger()
	quiet = zerolog.New(zerolog.MultiLevelWriter(file, jsonLines)).With().Timestamp().Str("run", rec.ID()[:8]).Logger()
	return log, quiet
}

// announce tells the user, as the run starts, where its record is, what
// runs it (the backend and its devices), and what the plan chose where
// the spec left it to planning.
func announce(w io.Writer, rec *jobs.Run, l *loaded, p *plan.Plan, backend, devices string, first, last, total int) {
	m := l.spec.Mesh
	cp := ""
	if m.CPSize() > 1 {
		cp = fmt.Sprintf(" × cp %d", m.CPSize())
	}
	fmt.Fprintf(w, "rlpipe: run %s, steps %d-%d of %d, on %s: %d rank(s), dp %d%s; record %s\n", rec.ID()[:8], first, last, total, backend, m.WorldSize(), m.DP, cp, rec.Dir())
	fmt.Fprintf(w, "rlpipe: devices: %s\n", devices)
	for _, c := range p.Auto {
		fmt.Fprintf(w, "rlpipe: plan: %s of %s: %s (%s)\n", c.Key, c.Subject, c.Value, c.Why)
	}
}

// recordStep appends the step's update lines and its summary line, which
// it returns.
func recordStep(rec *jobs.Run, sr stages.StepResult, cuda bool) (jobs.Metrics, error) {
	for _, u := range sr.Stats.Updates {
		m := jobs.Metrics{Step: sr.Step, Update: u.Index + 1, Epoch: u.Epoch, MiniBatch: u.MiniBatch, GradNorm: u.GradNorm, LR: u.LR, Tokens: u.Tokens}
		fillLoss(&m, u.Values)
		if err := rec.AppendUpdate(m); err != nil {
			return m, err
		}
	}
	m := metricsOf(sr)
	m.Time = time.Now()
	if cuda {
		if n, ok := deviceMemory(0); ok {
			m.Extra["nvml_bytes"] = float64(n)
		}
	}
	return m, rec.AppendMetrics(m)
}

// stepFields are the values of step metrics m the progress display shows:
// the loss, the reward of a live loop's rollouts, the RL metrics, then
// the others worth a look.
func stepFields(m jobs.Metrics) []jobs.Field {
	fields := []jobs.Field{jobs.F(jobs.FieldLoss, m.Loss)}
	if r, ok := m.Extra["reward_mean"]; ok {
		fields = append(fields, jobs.F(jobs.FieldReward, r))
	}
	fields = append(fields, jobs.F(jobs.FieldKL, m.KL), jobs.F(jobs.FieldEntropy, m.Entropy), jobs.F(jobs.FieldClipFrac, m.ClipFrac))
	if a, ok := m.Extra["adv_logp"]; ok {
		fields = append(fields, jobs.F("adv_logp", a))
	}
	return append(fields, jobs.F("grad_norm", m.GradNorm), jobs.F("lr", m.LR), jobs.F(jobs.FieldTokensPerS, m.TokensPerS))
}

// setupStages counts the job's setup stages.
func setupStages(j *stages.Job) int {
	n := 0
	for _, st := range j.Order {
		if st.Phase == spec.Setup {
			n++
		}
	}
	return n
}

// setupReporter returns the RunOptions.Progress of a run: it shows the
// setup on sp, logs each stage's start, progress (at sp's rate) and
// finish, and once the local ranks' setup is done, ends sp, restarts
// prog's clock and logs the setup's end.
func setupReporter(log zerolog.Logger, sp *jobs.SetupProgress, prog *jobs.Progress, local int) func(stages.SetupEvent) {
	var (
		mu    sync.Mutex // the ranks call it concurrently; events stay in order
		ready int
	)
	stage := func(event string, s jobs.SetupStatus) *zerolog.Event {
		e := log.Info().Str("event", event).Str("stage", s.Stage).Str("uses", s.Uses).Str("model", s.Model).Int("index", s.Index).Int("ranks", s.Ranks)
		if event == "setup_stage_started" {
			return e
		}
		return e.Int("tensors", s.Tensors).Int("total_tensors", s.TotalTensors).Int64("bytes", s.Bytes).Int64("total_bytes", s.TotalBytes).
			Float64("share", s.Share).Int("ranks_done", s.RanksDone).Float64("seconds", s.Seconds)
	}
	return func(ev stages.SetupEvent) {
		mu.Lock()
		defer mu.Unlock()
		switch ev.Kind {
		case stages.SetupStarted:
			if s, ok := sp.Start(ev.Rank, ev.Stage, ev.Uses, ev.Model); ok {
				stage("setup_stage_started", s).Msg("setup stage started")
			}
		case stages.SetupProgress:
			if s, ok := sp.Advance(ev.Rank, ev.Stage, ev.Tensors, ev.TotalTensors, ev.Bytes, ev.TotalBytes); ok {
				stage("setup_stage_progress", s).Msg("setup stage progress")
			}
		case stages.SetupFinished:
			sp.Advance(ev.Rank, ev.Stage, ev.Tensors, ev.TotalTensors, ev.Bytes, ev.TotalBytes)
			if s, ok := sp.Finish(ev.Rank, ev.Stage, ev.Seconds); ok {
				stage("setup_stage_finished", s).Msg("setup stage finished")
			}
		case stages.SetupDone:
			if ready++; ready == local {
				sp.Done()
				prog.Restart()
				log.Info().Str("event", "setup_finished").Float64("seconds", ev.Seconds).Msg("setup finished")
			}
		}
	}
}

// metricsOf turns a step result into the run record's metrics line.
func metricsOf(sr stages.StepResult) jobs.Metrics {
	m := jobs.Metrics{Step: sr.Step, Updates: len(sr.Stats.Updates), WallS: sr.Wall.Seconds(), GradNorm: sr.Stats.GradNorm, LR: sr.Stats.LR,
		Tokens: sr.Tokens, PeakMemBytes: sr.InUse}
	fillLoss(&m, sr.Stats.Values)
	if s := sr.Wall.Seconds(); s > 0 {
		m.TokensPerS = float64(sr.Tokens) / s
	}
	return m
}

// fillLoss puts the loss metrics v into m's fields and extras.
func fillLoss(m *jobs.Metrics, v map[string]float64) {
	m.Loss, m.PGLoss, m.KL, m.Entropy, m.ClipFrac = v["loss"], v["pg_loss"], v["kl_loss"], v["entropy_loss"], v["pg_clipfrac"]
	m.Extra = map[string]float64{}
	known := map[string]bool{"loss": true, "pg_loss": true, "kl_loss": true, "entropy_loss": true, "pg_clipfrac": true}
	for k, x := range v {
		if !known[k] {
			m.Extra[k] = x
		}
	}
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
		Inputs                []string `json:",omitempty"` // "input <- producer.output"
	}
	out := struct {
		Name           string
		Models         []model
		Mesh           spec.Mesh
		Data           spec.Data
		Train          spec.Train
		UpdatesPerStep int
		Policies       map[string]string
		GPU            stages.GPU
		Stages         []stage
	}{Name: l.spec.Name, Mesh: l.spec.Mesh, Data: l.spec.Data, Train: l.spec.Train, UpdatesPerStep: l.spec.UpdatesPerStep(), GPU: l.job.GPU, Policies: map[string]string{}}
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
	if pol.Recompute == nil {
		out.Policies["recompute"] = "auto" // what planning chose is in the plan's auto entries
	}
	for _, st := range l.job.Order {
		s := stage{ID: st.ID, Uses: st.Uses, Phase: string(st.Phase), With: l.job.Stages[st.ID]}
		if st.When != nil {
			s.When = st.When.Src
		}
		for _, n := range st.Needs {
			s.Needs = append(s.Needs, n.Name)
		}
		for _, e := range l.job.Graph.Node(st.ID).Inputs {
			s.Inputs = append(s.Inputs, e.In+" <- "+e.FromName()+"."+e.Out)
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
