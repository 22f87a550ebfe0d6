package cli

import (
	"bytes"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlpipe/rlpipe/jobs"
	"github.com/rlpipe/rlpipe/runtime/launch"
	"github.com/rlpipe/rlpipe/spec"
	"go.yaml.in/yaml/v3"
)

// childArgs, when set in the environment, makes the test binary run the
// command line it holds (arguments separated by newlines) instead of the
// tests: the multi-process tests start their ranks that way, as a
// launcher starts rlpipe.
const childArgs = "RLPIPE_TEST_CLI_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(childArgs); ok {
		os.Exit(Main(strings.Split(args, "\n"), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// meshSpec writes a copy of examples/tiny-grpo.yaml with dp ranks of one
// host and steps training steps, and returns its path.
func meshSpec(t *testing.T, dp, steps int) string {
	t.Helper()
	return exampleVariant(t, "tiny-grpo.yaml", "gpus_per_node: 1", fmt.Sprintf("gpus_per_node: %d", dp), "steps: 12", fmt.Sprintf("steps: %d", steps))
}

// cpSpec writes a copy of examples/tiny-cp2.yaml (cp 2) with dp cp groups
// on one host and steps training steps, and returns its path.
func cpSpec(t *testing.T, dp, steps int) string {
	t.Helper()
	return exampleVariant(t, "tiny-cp2.yaml", "gpus_per_node: 2", fmt.Sprintf("gpus_per_node: %d", 2*dp), "steps: 12", fmt.Sprintf("steps: %d", steps))
}

// rank is one started process of a job.
type rank struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
}

// startRanks starts n processes of the test binary running rlpipe args, with
// the environment torchrun gives its workers on one host.
func startRanks(t *testing.T, n int, extraEnv []string, args ...string) []*rank {
	t.Helper()
	return startNodes(t, 1, n, extraEnv, args...)
}

// startNodes starts nodes × perNode processes of the test binary running
// rlpipe args, with the environment torchrun's agents on nodes hosts give
// their workers (LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK, the node's
// rank), all on this host and joined at 127.0.0.1 as a cluster's are at
// the first host's address.
func startNodes(t *testing.T, nodes, perNode int, extraEnv []string, args ...string) []*rank {
	t.Helper()
	return startNodesArgs(t, nodes, perNode, extraEnv, func(int) []string { return args })
}

// startNodesArgs is startNodes with rank r running rlpipe argsOf(r).
func startNodesArgs(t *testing.T, nodes, perNode int, extraEnv []string, argsOf func(r int) []string) []*rank {
	t.Helper()
	n := nodes * perNode
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ranks := make([]*rank, n)
	for r := range ranks {
		p := &rank{cmd: exec.Command(os.Args[0])}
		p.cmd.Env = append(os.Environ(), childArgs+"="+strings.Join(argsOf(r), "\n"),
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n), "LOCAL_RANK="+strconv.Itoa(r%perNode), "LOCAL_WORLD_SIZE="+strconv.Itoa(perNode),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port), "GOMAXPROCS=1")
		if nodes > 1 {
			p.cmd.Env = append(p.cmd.Env, "GROUP_RANK="+strconv.Itoa(r/perNode))
		}
		p.cmd.Env = append(p.cmd.Env, extraEnv...)
		p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ranks[r] = p
	}
	t.Cleanup(func() {
		for _, p := range ranks {
			p.cmd.Process.Kill()
		}
	})
	return ranks
}

// wait waits for every process and returns their exit codes.
func wait(t *testing.T, ranks []*rank, limit time.Duration) []int {
	t.Helper()
	codes := make([]int, len(ranks))
	deadline := time.Now().Add(limit)
	for r, p := range ranks {
		done := make(chan error, 1)
		go func() { done <- p.cmd.Wait() }()
		select {
		case err := <-done:
			codes[r] = exitCode(err)
		case <-time.After(time.Until(deadline)):
			t.Fatalf("rank %d still running after %v (a hang)\nstderr: %s", r, limit, p.stderr.String())
		}
	}
	return codes
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

func (p *rank) String() string { return p.stdout.String() + p.stderr.String() }

// sameRunMetrics compares the metrics of the only runs under roots a
// and b (sameMetrics) and returns the runs.
func sameRunMetrics(t *testing.T, a, b string) (*jobs.Run, *jobs.Run) {
	t.Helper()
	ra, rb := onlyRun(t, a), onlyRun(t, b)
	am, err := ra.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	bm, err := rb.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	sameMetrics(t, am, bm)
	return ra, rb
}

// closeTo says whether two metrics agree to 1e-4, relative to their size.
func closeTo(a, b float64) bool { return math.Abs(a-b) <= 1e-4*math.Max(1, math.Abs(a)) }

// sameMetrics compares two runs' metrics.jsonl on every value but time.
func sameMetrics(t *testing.T, a, b []jobs.Metrics) {
	t.Helper()
	if len(a) != len(b) || len(a) == 0 {
		t.Fatalf("metrics lines: %d and %d", len(a), len(b))
	}
	for i := range a {
		x, y := a[i], b[i]
		pairs := map[string][2]float64{"loss": {x.Loss, y.Loss}, "pg_loss": {x.PGLoss, y.PGLoss}, "kl": {x.KL, y.KL}, "entropy": {x.Entropy, y.Entropy},
			"clipfrac": {x.ClipFrac, y.ClipFrac}, "grad_norm": {x.GradNorm, y.GradNorm}, "lr": {x.LR, y.LR}, "tokens": {float64(x.Tokens), float64(y.Tokens)}}
		for k, v := range x.Extra {
			pairs[k] = [2]float64{v, y.Extra[k]}
		}
		if len(x.Extra) != len(y.Extra) {
			t.Errorf("step %d: extra metrics %v and %v", x.Step, x.Extra, y.Extra)
		}
		for k, v := range pairs {
			if !closeTo(v[0], v[1]) {
				t.Errorf("step %d: %s is %v in one process and %v across processes", x.Step, k, v[0], v[1])
			}
		}
	}
}

// TestProcessPerRank runs the tiny recipe at dp 2 and 4, and with context
// parallelism at dp 1 × cp 2 and dp 2 × cp 2, as one process and as a
// process per rank (torchrun's environment, the CPU backend, the TCP
// communicator, and for cp a TCP communicator per cp group split from
// it), and checks that every metric agrees to 1e-4, that the exports are
// equal, and that a run of 2 processes resumes as 2 processes.
func TestProcessPerRank(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	tests := []struct {
		name  string
		nodes int // hosts the launcher says it spans (1: one)
		ranks int
		spec  func(t *testing.T) string
	}{
		{"dp 2", 1, 2, func(t *testing.T) string { return meshSpec(t, 2, 4) }},
		{"dp 4", 1, 4, func(t *testing.T) string { return meshSpec(t, 4, 4) }},
		{"dp 1 × cp 2", 1, 2, func(t *testing.T) string { return cpSpec(t, 1, 4) }},
		{"dp 2 × cp 2", 1, 4, func(t *testing.T) string { return cpSpec(t, 2, 4) }},
		{"dp 2, checkpoints in the background", 1, 2, func(t *testing.T) string {
			return exampleVariant(t, "tiny-grpo.yaml", "gpus_per_node: 1", "gpus_per_node: 2", "steps: 12", "steps: 4",
				"checkpoint_every: 6", "checkpoint_every: 2\n  checkpoint_async: true")
		}},
		// Two nodes of two ranks: the ranks of a node are consecutive,
		// as torchrun and srun number them, so each cp group is a node's.
		{"two nodes, dp 4", 2, 4, func(t *testing.T) string {
			return exampleVariant(t, "tiny-grpo.yaml", "gpus_per_node: 1", "nodes: 2\n  gpus_per_node: 2", "steps: 12", "steps: 4")
		}},
		{"two nodes, dp 2 × cp 2", 2, 4, func(t *testing.T) string {
			return exampleVariant(t, "tiny-cp2.yaml", "gpus_per_node: 2", "nodes: 2\n  gpus_per_node: 2", "steps: 12", "steps: 4")
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec, n := tc.spec(t), tc.ranks
			one, many := t.TempDir(), t.TempDir()
			if code, out, errs := runCLI(t, "run", "--backend", "cpu", "--runs", one, spec); code != exitOK {
				t.Fatalf("one process: exit %d\n%s%s", code, out, errs)
			}
			ranks := startNodes(t, tc.nodes, n/tc.nodes, nil, "run", "--backend", "cpu", "--runs", many, spec)
			for r, code := range wait(t, ranks, 2*time.Minute) {
				if code != exitOK {
					t.Fatalf("rank %d: exit %d\n%v", r, code, ranks[r])
				}
			}
			if !strings.Contains(ranks[0].stdout.String(), "succeeded: steps 1-4 of 4") || ranks[1].stdout.Len() != 0 {
				t.Errorf("rank 0 reports the run, the others say nothing:\nrank 0: %s\nrank 1: %s", ranks[0].stdout.String(), ranks[1].stdout.String())
			}
			a, b := sameRunMetrics(t, one, many)
			for r := range n {
				if _, err := os.Stat(filepath.Join(checkpointPath(b.Dir(), 4), fmt.Sprintf("rank-%d", r))); err != nil {
					t.Errorf("rank %d wrote no checkpoint shard: %v", r, err)
				}
			}
			if strings.Contains(tc.name, "background") {
				// The processes agreed over TCP when every background
				// write had finished: both checkpoints are committed, and
				// hold what one process wrote.
				for _, step := range []int{2, 4} {
					for r := range n {
						f := filepath.Join(fmt.Sprintf("rank-%d", r), "model.safetensors")
						if !bytes.Equal(readAll(t, filepath.Join(checkpointPath(a.Dir(), step), f)), readAll(t, filepath.Join(checkpointPath(b.Dir(), step), f))) {
							t.Errorf("step %d, rank %d: the checkpoint differs from one process's", step, r)
						}
					}
				}
				if cks, err := b.Checkpoints(); err != nil || len(cks) != 2 {
					t.Errorf("committed checkpoints %+v (%v), want steps 2 and 4", cks, err)
				}
			}
			ea := readAll(t, filepath.Join(a.Dir(), "export", "actor", "model.safetensors"))
			eb := readAll(t, filepath.Join(b.Dir(), "export", "actor", "model.safetensors"))
			if !bytes.Equal(ea, eb) {
				t.Error("the exports of one process and of a process per rank differ")
			}
		})
	}
	t.Run("resume", func(t *testing.T) {
		spec := meshSpec(t, 2, 4)
		one, many := t.TempDir(), t.TempDir()
		if code, out, errs := runCLI(t, "run", "--backend", "cpu", "--runs", one, spec); code != exitOK {
			t.Fatalf("one process: exit %d\n%s%s", code, out, errs)
		}
		ranks := startRanks(t, 2, nil, "run", "--backend", "cpu", "--runs", many, "--steps", "2", spec)
		for r, code := range wait(t, ranks, 2*time.Minute) {
			if code != exitOK {
				t.Fatalf("first half, rank %d: exit %d\n%v", r, code, ranks[r])
			}
		}
		id := onlyRun(t, many).ID()[:8]
		ranks = startRanks(t, 2, nil, "run", "--backend", "cpu", "--runs", many, "--resume", id)
		for r, code := range wait(t, ranks, 2*time.Minute) {
			if code != exitOK {
				t.Fatalf("resume, rank %d: exit %d\n%v", r, code, ranks[r])
			}
		}
		if !strings.Contains(ranks[0].stdout.String(), "succeeded: steps 3-4 of 4") {
			t.Errorf("resume: %s", ranks[0])
		}
		am, _ := onlyRun(t, one).Metrics()
		bm, _ := onlyRun(t, many).Metrics()
		sameMetrics(t, am, bm)
	})
}

// TestProcessFailures checks that a job of processes fails fast, and
// says which rank, when one never arrives, when the launcher's world does
// not match the recipe, and when one is killed (also one of a cp group).
func TestProcessFailures(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	t.Run("a rank never arrives", func(t *testing.T) {
		spec := meshSpec(t, 2, 3)
		ranks := startRanks(t, 2, []string{"RLPIPE_JOIN_TIMEOUT=1s"}, "run", "--backend", "cpu", "--runs", t.TempDir(), spec)
		ranks[1].cmd.Process.Kill() // rank 1 never joins
		codes := wait(t, ranks, time.Minute)
		if codes[0] != exitFailed || !strings.Contains(ranks[0].stderr.String(), "rank 1 of 2 did not join within 1s") {
			t.Errorf("rank 0: exit %d\n%v", codes[0], ranks[0])
		}
	})
	t.Run("the launcher's world is not the recipe's", func(t *testing.T) {
		spec := meshSpec(t, 4, 3)
		ranks := startRanks(t, 2, nil, "run", "--backend", "cpu", "--runs", t.TempDir(), spec)
		for r, code := range wait(t, ranks, time.Minute) {
			if code != exitInvalid || !strings.Contains(ranks[r].stderr.String(), "dp × cp is 4 × 1 = 4 ranks, but env started 2 processes") {
				t.Errorf("rank %d: exit %d\n%v", r, code, ranks[r])
			}
		}
	})
	t.Run("the ranks plan differently", func(t *testing.T) {
		// With micro-batches of 256 tokens the plan takes gather_once for
		// both models where it fits; rank 1 plans for a GPU of the bytes
		// the job needs without it. The job's device total is 2461163008
		// bytes without gather_once and 2461294336 with it (rlpipe plan
		// --json --gpu of the spec, device_total_bytes, at GPUs either
		// side); rank 1's GPU lies between the two.
		spec := exampleVariant(t, "tiny-grpo.yaml", "gpus_per_node: 1", "gpus_per_node: 2", "steps: 12", "steps: 3", "max_tokens_per_gpu: 768", "max_tokens_per_gpu: 256")
		gpus := []string{"h100-80g", "2461228544"}
		root := t.TempDir()
		ranks := startNodesArgs(t, 1, 2, nil, func(r int) []string {
			return []string{"run", "--backend", "cpu", "--gpu", gpus[r], "--runs", root, spec}
		})
		codes := wait(t, ranks, time.Minute)
		for r, want := range []string{"rank 0: 1 rank(s) planned the job differently from rank 0",
			`rank 1 planned the job differently from rank 0 ("gather_once of model actor: false" here, "gather_once of model actor: true" on rank 0)`} {
			if codes[r] != exitFailed || !strings.Contains(ranks[r].stderr.String(), want) {
				t.Errorf("rank %d: exit %d, want %d and %q\n%v", r, codes[r], exitFailed, want, ranks[r])
			}
		}
	})
	for _, tc := range []struct {
		name string
		spec func(t *testing.T) string
	}{
		{"kill -9 of a rank", func(t *testing.T) string { return meshSpec(t, 2, 500) }},
		{"kill -9 of a rank of a cp group", func(t *testing.T) string { return cpSpec(t, 1, 500) }},
	} {
		t.Run(tc.name, func(t *testing.T) { killRank(t, tc.spec(t)) })
	}
}

// killRank starts a job of 2 processes running spec, kills rank 1 after
// the first step, and checks that rank 0 fails at once naming it.
func killRank(t *testing.T, spec string) {
	t.Helper()
	root := t.TempDir()
	ranks := startRanks(t, 2, nil, "run", "--backend", "cpu", "--runs", root, spec)
	// Wait for the first step, then kill rank 1 as the OOM killer would.
	deadline := time.Now().Add(time.Minute)
	for {
		metas, _ := jobs.List(root)
		if len(metas) == 1 {
			if r, err := jobs.Open(root, metas[0].ID); err == nil {
				if m, err := r.Metrics(); err == nil && len(m) > 0 {
					break
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no step within a minute\n%v", ranks[0])
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := ranks[1].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	codes := wait(t, ranks, 30*time.Second)
	if codes[0] != exitFailed || !strings.Contains(ranks[0].stderr.String(), "lost rank 1 on ") {
		t.Errorf("rank 0: exit %d after rank 1 was killed\n%v", codes[0], ranks[0])
	}
	t.Logf("rank 0 failed %v after the kill: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(ranks[0].stderr.String()))
	m := onlyRun(t, root).Meta()
	if m.Status != jobs.StatusFailed || !strings.Contains(m.Error, "lost rank 1") {
		t.Errorf("the record says %s (%q), want failed, naming rank 1", m.Status, m.Error)
	}
}

// TestLaunchFiles parses the Kubernetes launch files and checks that the
// ranks they start are the recipe's: the replicas of the PyTorchJob, and
// the JobSet's parallelism and WORLD_SIZE, equal mesh.dp of the spec they
// run.
func TestLaunchFiles(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "examples", "launch")
	load := func(name string) map[string]any {
		var doc map[string]any
		if err := yaml.Unmarshal(readAll(t, filepath.Join(dir, name)), &doc); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return doc
	}
	dig := func(v any, path ...any) any {
		for _, p := range path {
			switch k := p.(type) {
			case string:
				v = v.(map[string]any)[k]
			case int:
				v = v.([]any)[k]
			}
		}
		return v
	}
	dp := func(cmd any) int {
		args := cmd.([]any)
		s, err := spec.Load(filepath.Join("..", "..", "..", "examples", filepath.Base(args[len(args)-1].(string))))
		if err != nil {
			t.Fatal(err)
		}
		return s.Mesh.DP
	}
	pj := dig(load("pytorchjob.yaml"), "spec", "pytorchReplicaSpecs")
	replicas := dig(pj, "Master", "replicas").(int) + dig(pj, "Worker", "replicas").(int)
	if want := dp(dig(pj, "Master", "template", "spec", "containers", 0, "command")); replicas != want {
		t.Errorf("pytorchjob.yaml starts %d pods, the recipe has dp %d", replicas, want)
	}
	job := dig(load("jobset.yaml"), "spec", "replicatedJobs", 0, "template", "spec")
	c := dig(job, "template", "spec", "containers", 0)
	world := -1
	for _, e := range dig(c, "env").([]any) {
		if e.(map[string]any)["name"] == "WORLD_SIZE" {
			world, _ = strconv.Atoi(e.(map[string]any)["value"].(string))
		}
	}
	if want := dp(dig(c, "command")); dig(job, "parallelism").(int) != want || world != want {
		t.Errorf("jobset.yaml: parallelism %v, WORLD_SIZE %d; the recipe has dp %d", dig(job, "parallelism"), world, want)
	}
}

// TestProcessCheck checks the launcher's world against the mesh: the
// number of processes must be dp × cp (cp > 1 runs a process per rank
// too), the processes on a host gpus_per_node.
func TestProcessCheck(t *testing.T) {
	tests := []struct {
		name                string
		nodes, gpus, dp, cp int
		size, host          int
		err                 string
	}{
		{"dp 2", 1, 2, 2, 1, 2, 2, ""},
		{"too few", 1, 2, 2, 1, 1, 1, "dp × cp is 2 × 1 = 2 ranks, but torchrun started 1 processes"},
		{"per host", 2, 2, 4, 1, 4, 1, "gpus_per_node is 2, but torchrun started 1 processes on this host"},
		{"dp 1 × cp 2", 1, 2, 1, 2, 2, 2, ""},
		{"dp 2 × cp 2", 1, 4, 2, 2, 4, 4, ""},
		{"cp counts", 1, 4, 2, 2, 2, 2, "dp × cp is 2 × 2 = 4 ranks, but torchrun started 2 processes"},
		{"cp per host", 2, 2, 2, 2, 4, 4, "gpus_per_node is 2, but torchrun started 4 processes on this host"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := spec.Load(tinySpec)
			if err != nil {
				t.Fatal(err)
			}
			s.Mesh.Nodes, s.Mesh.GPUsPerNode, s.Mesh.DP, s.Mesh.CP = tc.nodes, tc.gpus, tc.dp, tc.cp
			p := &process{w: launch.World{Rank: 0, Size: tc.size, LocalSize: tc.host, Launcher: "torchrun", Source: "test"}}
			err = p.check(s)
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("check: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("check = %v, want %q", err, tc.err)
			}
		})
	}
}
