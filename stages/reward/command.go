package reward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"
)

// stderrTail is how much of the end of a command's stderr errors quote.
const stderrTail = 2048

// commandScorer scores a batch with a program that speaks the JSONL
// protocol over its stdin and stdout.
//
// Once per Score call it starts the program (argv as configured, the
// environment and working directory of this process, in a process group of
// its own), writes one JSON object per sample to its stdin:
//
//	{"index": i, "group": g, "prompt_tokens": [...], "response_tokens": [...], "finish": "...", "label": {...}}
//
// and closes it. Meanwhile it reads the program's stdout, which must hold
// exactly one line per sample, in order, each a JSON number or an object
// with a numeric "reward" field; the program must then exit with status 0.
// Stdin is written and stdout read concurrently (by os/exec's copying
// goroutines), so a program that answers as it reads cannot deadlock on a
// large batch. A non-zero exit, a timeout, a wrong line count, a
// non-numeric or non-finite reward are errors that name the command and, for
// a bad line, its 1-based number, and end with the last 2 KiB of stderr. On
// timeout or cancellation of ctx the whole process group is killed.
type commandScorer struct {
	path      string   // the program as found by exec.LookPath
	argv      []string // as configured; argv[0] is what the program sees
	timeout   time.Duration
	waitDelay time.Duration // how long to wait for stdout and stderr to close after the program exits or is killed
}

// newCommandScorer returns the scorer of the program at path run with argv.
func newCommandScorer(path string, argv []string, timeout time.Duration) *commandScorer {
	return &commandScorer{
		path:      path,
		argv:      append([]string(nil), argv...),
		timeout:   timeout,
		waitDelay: 2 * time.Second,
	}
}

// name names the command in error messages.
func (c *commandScorer) name() string { return fmt.Sprintf("%q", strings.Join(c.argv, " ")) }

// Score implements Scorer.
func (c *commandScorer) Score(ctx context.Context, samples []Sample) ([]float64, error) {
	if len(samples) == 0 {
		return []float64{}, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("reward command %s: %w", c.name(), err)
	}
	payload, err := encodeBatch(samples)
	if err != nil {
		return nil, fmt.Errorf("reward command %s: %w", c.name(), err)
	}

	runCtx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	cmd := exec.CommandContext(runCtx, c.path, c.argv[1:]...)
	cmd.Args[0] = c.argv[0]
	cmd.Stdin = bytes.NewReader(payload)
	stdout, stdoutW := io.Pipe()
	cmd.Stdout = stdoutW
	stderr := &tailBuffer{max: stderrTail}
	cmd.Stderr = stderr
	cmd.WaitDelay = c.waitDelay
	ownProcessGroup(cmd)

	type answer struct {
		rewards []float64
		err     error
	}
	answers := make(chan answer, 1)
	go func() {
		r, err := readRewards(stdout, len(samples))
		answers <- answer{r, err}
	}()
	runErr := cmd.Run() // returns once the copying goroutines are done
	stdoutW.Close()
	ans := <-answers

	// A program that exited with status 0 but left a child holding its
	// stdout open gets ErrWaitDelay: its answer is judged on what it wrote.
	succeeded := runErr == nil ||
		errors.Is(runErr, exec.ErrWaitDelay) && cmd.ProcessState != nil && cmd.ProcessState.Success()
	if succeeded && ans.err == nil {
		return ans.rewards, nil
	}
	tail := ""
	if stderr.total > 0 {
		tail = "; stderr: " + stderr.String()
	}
	switch {
	case ctx.Err() != nil:
		return nil, fmt.Errorf("reward command %s: %w", c.name(), ctx.Err())
	case errors.Is(runCtx.Err(), context.DeadlineExceeded):
		return nil, fmt.Errorf("reward command %s: timed out after %v%s: %w", c.name(), c.timeout, tail, context.DeadlineExceeded)
	case !succeeded:
		return nil, fmt.Errorf("reward command %s: %w%s", c.name(), runErr, tail)
	default:
		return nil, fmt.Errorf("reward command %s: stdout %w%s", c.name(), ans.err, tail)
	}
}
