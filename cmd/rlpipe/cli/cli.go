// Package cli is the rlpipe command line: validate, plan, graph, run,
// export, logprobs, jobs, stages, doctor, version, help, completion. cmd/rlpipe is a two-line main around Main; a
// build of rlpipe with extra stage plugins is the same main with the
// plugins' packages imported for their init-time stages.Register calls.
package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
)

// Exit codes.
const (
	exitOK       = 0
	exitFailed   = 1 // the job (or a command) failed at run time
	exitUsage    = 2 // bad command line
	exitInvalid  = 3 // the spec has errors
	exitNoFit    = 4 // the plan does not fit on the GPU
	exitCanceled = 130
)

// version is set at build time with
// -ldflags "-X github.com/rlpipe/rlpipe/cmd/rlpipe/cli.version=...".
var version = "dev"

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *cli, args []string) int
}

// cli holds the process-wide streams and logger, and the state signals
// act on.
type cli struct {
	stdout io.Writer
	stderr io.Writer
	log    zerolog.Logger
	// graceful is set while a run can stop at its next step boundary;
	// stop is set when a signal asked it to.
	graceful, stop atomic.Bool
	// describe, when set, receives a command's flags and the names of
	// its positional arguments instead of running it (see parseFlags).
	describe func(fs *flag.FlagSet, names []string)
}

func commands() []command {
	return []command{
		{"validate", "check a job spec and report every problem with file:line:col", cmdValidate},
		{"plan", "print the per-GPU memory budget of every stage", cmdPlan},
		{"graph", "print the stage DAG (text, --json or --dot)", cmdGraph},
		{"run", "run the job (or --resume a run) and record it under ./runs", cmdRun},
		{"export", "write a run's model, at any committed checkpoint, as an HF checkpoint", cmdExport},
		{"logprobs", "a model's per-token log-probs of a rollout file, and their mismatch with the rollout's", cmdLogprobs},
		{"jobs", "list run records, or show one", cmdJobs},
		{"stages", "list the registered stage kinds", cmdStages},
		{"schema", "print the JSON Schema of the job spec, for editors", cmdSchema},
		{"doctor", "report CUDA, NVRTC, cuBLASLt and GPUs; compile every kernel", cmdDoctor},
		{"version", "print the version (also rlpipe --version)", cmdVersion},
		{"help", "print this help, or a command's (rlpipe help COMMAND)", cmdHelp},
		{"completion", "print a shell completion script: bash, zsh or fish", cmdCompletion},
	}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "rlpipe: declarative RL post-training pipelines.\n\nUsage:\n  rlpipe <command> [flags] [args]\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nFlags may come before or after a command's arguments; -- ends them.\nRun 'rlpipe <command> -h' for a command's flags.\n")
}

func newLogger(w io.Writer) zerolog.Logger {
	if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
		return zerolog.New(zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}).With().Timestamp().Logger()
	}
	return zerolog.New(w).With().Timestamp().Logger()
}

// Main runs the command line with args (without the program name) and
// returns the process exit code. On SIGINT (Ctrl-C) or SIGTERM a run in
// progress finishes its step, checkpoints it and stops, recorded as
// stopped and resumable; a second signal, or a signal to any other
// command, cancels at once.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	env := newCLI(stdout, stderr)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		for sig := range sigs {
			if env.graceful.Load() && !env.stop.Swap(true) {
				fmt.Fprintf(stderr, "rlpipe: %v: stopping after this step, with a checkpoint (send it again to abort now)\n", sig)
				continue
			}
			cancel(fmt.Errorf("%v", sig))
		}
	}()
	return env.main(ctx, args)
}

func newCLI(stdout, stderr io.Writer) *cli {
	return &cli{stdout: stdout, stderr: stderr, log: newLogger(stderr)}
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return newCLI(stdout, stderr).main(ctx, args)
}

// main runs the command of args.
func (env *cli) main(ctx context.Context, args []string) int {
	if len(args) == 0 {
		usage(env.stderr)
		return exitUsage
	}
	switch {
	case isHelp(args[0]):
		usage(env.stdout)
		return exitOK
	case args[0] == "--version" || args[0] == "-version":
		return cmdVersion(ctx, env, args[1:])
	}
	c, ok := lookup(args[0])
	if !ok {
		if strings.HasPrefix(args[0], "-") {
			fmt.Fprintf(env.stderr, "rlpipe: unknown flag %s before the command (see 'rlpipe -h')\n", args[0])
		} else {
			fmt.Fprintf(env.stderr, "rlpipe: unknown command %q (see 'rlpipe -h')\n", args[0])
		}
		return exitUsage
	}
	return c.run(ctx, env, args[1:])
}

// lookup returns the command called name.
func lookup(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

func cmdVersion(_ context.Context, env *cli, args []string) int {
	fs := newFlagSet("version", "Usage: rlpipe version\n       rlpipe --version\n\nPrints the version of rlpipe.\n")
	if code, ok := parseFlags(fs, env, args); !ok {
		return code
	}
	fmt.Fprintf(env.stdout, "rlpipe %s\n", version)
	return exitOK
}

func cmdHelp(ctx context.Context, env *cli, args []string) int {
	fs := newFlagSet("help", "Usage: rlpipe help [COMMAND]\n\nPrints the list of commands, or a command's usage and flags (as rlpipe COMMAND -h).\n")
	if code, ok := parseFlags(fs, env, args, "COMMAND?"); !ok {
		return code
	}
	if fs.NArg() == 0 {
		usage(env.stdout)
		return exitOK
	}
	c, ok := lookup(fs.Arg(0))
	if !ok {
		return env.argError(fs, "unknown command %q", fs.Arg(0))
	}
	return c.run(ctx, env, []string{"-h"})
}
