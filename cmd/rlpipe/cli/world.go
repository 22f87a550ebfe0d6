package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/runtime/launch"
	"github.com/rlpipe/rlpipe/spec"
)

// process is this process's place in a job of one process per rank,
// started by a launcher (torchrun, srun, a Kubernetes operator): its rank
// and the control communicator joining it to the others. A nil *process
// is the default: one process runs every rank.
type process struct {
	w       launch.World
	host    string
	ctl     nccl.Comm
	timeout time.Duration // how long joins wait for the other processes
}

// joinTimeoutEnv overrides how long a process waits for the others.
const joinTimeoutEnv = "RLPIPE_JOIN_TIMEOUT"

// launched returns the process's world when a launcher started several
// processes (nil when it started one, or none did).
func launched() (*process, error) {
	w, ok, err := launch.FromEnv(nil)
	if err != nil || !ok || w.Size == 1 {
		return nil, err
	}
	host, _ := os.Hostname()
	return &process{w: w, host: host}, nil
}

// rank is the process's rank (0 for the single process).
func (p *process) rank() int {
	if p == nil {
		return 0
	}
	return p.w.Rank
}

// size is the number of processes (0 for the single process).
func (p *process) size() int {
	if p == nil {
		return 0
	}
	return p.w.Size
}

// who names the process in messages: "" alone, "rank 1 on host: " in a job
// of several.
func (p *process) who() string {
	if p == nil {
		return ""
	}
	return fmt.Sprintf("rank %d on %s: ", p.w.Rank, p.host)
}

// check reports a launcher world that does not match the spec's mesh: the
// recipe says how many ranks run (dp × cp), and the launcher must start
// that many.
func (p *process) check(s *spec.Spec) error {
	m := s.Mesh
	if p.w.Size != m.WorldSize() {
		return spec.Errors{spec.Errorf(m.Pos, "mesh: dp × cp is %d × %d = %d ranks, but %s started %d processes (%s); start one process per rank", m.DP, m.CPSize(), m.WorldSize(), p.w.Launcher, p.w.Size, p.w.Source)}
	}
	if p.w.LocalSize > 0 && p.w.LocalSize != m.GPUsPerNode {
		return spec.Errors{spec.Errorf(m.Pos, "mesh: gpus_per_node is %d, but %s started %d processes on this host", m.GPUsPerNode, p.w.Launcher, p.w.LocalSize)}
	}
	return nil
}

// join connects the process to the others (the control communicator).
func (p *process) join(ctx context.Context) error {
	timeout := nccl.DefaultJoinTimeout
	if v := os.Getenv(joinTimeoutEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return fmt.Errorf("%s=%q is not a positive duration (like 90s or 10m)", joinTimeoutEnv, v)
		}
		timeout = d
	}
	c, err := nccl.JoinTCP(ctx, nccl.TCPConfig{Rank: p.w.Rank, Size: p.w.Size, Addr: p.w.Addr, Job: p.w.Job, Timeout: timeout, Host: p.host})
	if err != nil {
		return err
	}
	p.ctl, p.timeout = c, timeout
	return nil
}

// cpGroup joins the process to its context-parallel group (mesh.cp =
// cp > 1): the processes of its dp rank, ranks dp·cp … dp·cp+cp−1, as a
// TCP communicator of their own whose rank is the process's cp rank. It
// is split from the control communicator, which stays open.
func (p *process) cpGroup(ctx context.Context, cp int) (nccl.Comm, error) {
	dp := p.w.Rank / cp
	name := fmt.Sprintf("cp group %d (ranks %d-%d)", dp, dp*cp, dp*cp+cp-1)
	return nccl.Split(ctx, p.ctl, nccl.SplitConfig{Color: dp, Key: p.w.Rank % cp, Name: name, Timeout: p.timeout})
}

// abort aborts the control communicator because of err, which the other
// processes then fail with instead of waiting for this one (in a
// collective, or in NCCL's split of their communicators, which the
// control communicator's failure aborts).
func (p *process) abort(err error) {
	if a, ok := p.ctl.(interface{ Abort(error) }); ok {
		a.Abort(err)
	}
}

// close leaves the job.
func (p *process) close() {
	if p != nil && p.ctl != nil {
		p.ctl.Close()
	}
}

// runInfo is what rank 0 tells the others before a run: where its record
// is and where the run starts.
type runInfo struct {
	Dir       string `json:"dir"`        // the run directory (checkpoints go under it)
	First     int    `json:"first"`      // the first step to run
	ResumeDir string `json:"resume_dir"` // the checkpoint to load, if any
	Skip      bool   `json:"skip"`       // nothing to train: rank 0 only finishes the export
	Err       string `json:"err"`        // rank 0 could not start the run
}

// share sends rank 0's info to every rank (the single process keeps its
// own).
func (p *process) share(ctx context.Context, info runInfo) (runInfo, error) {
	if p == nil {
		return info, nil
	}
	var data []byte
	if p.w.Rank == 0 {
		var err error
		if data, err = json.Marshal(info); err != nil {
			return runInfo{}, err
		}
	}
	data, err := nccl.BroadcastBytes(ctx, p.ctl, 0, data)
	if err != nil {
		return runInfo{}, err
	}
	var got runInfo
	if err := json.Unmarshal(data, &got); err != nil {
		return runInfo{}, fmt.Errorf("the run's start from rank 0: %w", err)
	}
	return got, nil
}
