// Package launch reads where a launcher put this process: its rank in a job
// of several processes, the host and port of rank 0, and the job's id. It
// knows torchrun's environment (also set by Kubeflow's PyTorchJob, the
// JobSet recipes and most Kubernetes operators) and Slurm's (srun).
package launch

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// World is this process's place in a job of Size processes.
type World struct {
	// Launcher names the environment read: "torchrun" (torchrun's agent),
	// "env" (RANK and WORLD_SIZE set by something else, as PyTorchJob
	// does) or "slurm" (srun).
	Launcher string
	// Rank is the process's rank in [0, Size).
	Rank, Size int
	// LocalRank is its index among the processes of its host, LocalSize
	// their number (0 when the launcher does not say).
	LocalRank, LocalSize int
	// Addr is host:port where rank 0 meets the others.
	Addr string
	// Job identifies the job, so that a process of another job that
	// reaches Addr is refused ("" when the launcher gives no id).
	Job string
	// Source says which variables gave Rank, Size and Addr, for messages.
	Source string
}

// Lookup returns the value of an environment variable and whether it is
// set (os.LookupEnv).
type Lookup func(string) (string, bool)

// DefaultPort is rank 0's port when neither RLPIPE_PORT nor MASTER_PORT
// says (torch.distributed's default).
const DefaultPort = 29500

// FromEnv reads the launcher's variables: torchrun's (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) first, then
// srun's (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID,
// SLURM_STEP_TASKS_PER_NODE, SLURM_NODEID, SLURM_STEP_NODELIST,
// SLURM_JOB_ID, SLURM_STEP_ID). ok is false when no launcher started the
// process (neither WORLD_SIZE nor SLURM_STEP_NUM_TASKS is set), which is
// also how a Slurm batch script that did not go through srun looks.
//
// Rank 0 listens on RLPIPE_PORT when set, else on MASTER_PORT, except under
// torchrun's agent, whose own store already holds MASTER_PORT
// (TORCHELASTIC_USE_AGENT_STORE=True): there it takes MASTER_PORT+1. Under
// Slurm without either it takes a port derived from the job id, so that
// jobs sharing a node do not collide.
func FromEnv(env Lookup) (w World, ok bool, err error) {
	if env == nil {
		env = os.LookupEnv
	}
	if _, set := env("WORLD_SIZE"); set {
		w, err = torchrun(env)
		return w, err == nil, err
	}
	if _, set := env("SLURM_STEP_NUM_TASKS"); set {
		w, err = slurm(env)
		return w, err == nil, err
	}
	return World{}, false, nil
}

// reader reads integer variables, keeping the first error.
type reader struct {
	env Lookup
	err error
}

// int reads variable name; def when unset (required: an error).
func (r *reader) int(name string, def int, required bool) int {
	s, set := r.env(name)
	s = strings.TrimSpace(s)
	if !set || s == "" {
		if required && r.err == nil {
			r.err = fmt.Errorf("%s is not set", name)
		}
		return def
	}
	v, err := strconv.Atoi(s)
	if (err != nil || v < 0) && r.err == nil {
		r.err = fmt.Errorf("%s=%q is not a non-negative integer", name, s)
	}
	return v
}

func (r *reader) str(name string) string {
	s, _ := r.env(name)
	return strings.TrimSpace(s)
}

func torchrun(env Lookup) (World, error) {
	r := &reader{env: env}
	w := World{Launcher: "env", Source: "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"}
	if r.str("TORCHELASTIC_RUN_ID") != "" || r.str("GROUP_RANK") != "" {
		w.Launcher = "torchrun"
	}
	w.Size = r.int("WORLD_SIZE", 1, true)
	w.Rank = r.int("RANK", 0, w.Size > 1)
	w.LocalRank = r.int("LOCAL_RANK", 0, false)
	w.LocalSize = r.int("LOCAL_WORLD_SIZE", 0, false)
	port := r.int("MASTER_PORT", DefaultPort, false)
	if strings.EqualFold(r.str("TORCHELASTIC_USE_AGENT_STORE"), "true") {
		port++
	}
	port = r.int("RLPIPE_PORT", port, false)
	w.Job = r.str("TORCHELASTIC_RUN_ID")
	if r.err != nil {
		return World{}, fmt.Errorf("launcher environment: %w", r.err)
	}
	host := r.str("MASTER_ADDR")
	if host == "" {
		if w.Size > 1 {
			return World{}, fmt.Errorf("launcher environment: WORLD_SIZE is %d but MASTER_ADDR is not set", w.Size)
		}
		host = "127.0.0.1"
	}
	w.Addr = joinHostPort(host, port)
	return w, w.check()
}

func slurm(env Lookup) (World, error) {
	r := &reader{env: env}
	w := World{Launcher: "slurm", Source: "SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST"}
	w.Size = r.int("SLURM_STEP_NUM_TASKS", 1, true)
	w.Rank = r.int("SLURM_PROCID", 0, true)
	w.LocalRank = r.int("SLURM_LOCALID", 0, false)
	node := r.int("SLURM_NODEID", 0, false)
	job := r.int("SLURM_JOB_ID", 0, false)
	port := DefaultPort
	if job > 0 {
		port = 20000 + job%20000
	}
	port = r.int("MASTER_PORT", port, false)
	port = r.int("RLPIPE_PORT", port, false)
	if r.err != nil {
		return World{}, fmt.Errorf("launcher environment: %w", r.err)
	}
	if per := r.str("SLURM_STEP_TASKS_PER_NODE"); per != "" {
		counts, err := expandCounts(per)
		if err != nil {
			return World{}, fmt.Errorf("launcher environment: SLURM_STEP_TASKS_PER_NODE=%q: %w", per, err)
		}
		if node < len(counts) {
			w.LocalSize = counts[node]
		}
	}
	if job > 0 {
		w.Job = strconv.Itoa(job)
		if step := r.str("SLURM_STEP_ID"); step != "" {
			w.Job += "." + step
		}
	}
	host := r.str("MASTER_ADDR")
	if host == "" {
		list := r.str("SLURM_STEP_NODELIST")
		if list == "" {
			list = r.str("SLURM_JOB_NODELIST")
		}
		hosts, err := ExpandHostList(list)
		if err != nil {
			return World{}, fmt.Errorf("launcher environment: SLURM_STEP_NODELIST=%q: %w", list, err)
		}
		if len(hosts) == 0 {
			if w.Size > 1 {
				return World{}, fmt.Errorf("launcher environment: SLURM_STEP_NUM_TASKS is %d but neither SLURM_STEP_NODELIST nor MASTER_ADDR names rank 0's host", w.Size)
			}
			hosts = []string{"127.0.0.1"}
		}
		host = hosts[0]
	}
	w.Addr = joinHostPort(host, port)
	return w, w.check()
}

func (w World) check() error {
	switch {
	case w.Size < 1:
		return fmt.Errorf("launcher environment (%s): world size %d", w.Launcher, w.Size)
	case w.Rank >= w.Size:
		return fmt.Errorf("launcher environment (%s): rank %d is outside a world of %d", w.Launcher, w.Rank, w.Size)
	case w.Addr == "" || strings.HasSuffix(w.Addr, ":0"):
		return fmt.Errorf("launcher environment (%s): no port for rank 0 (set RLPIPE_PORT)", w.Launcher)
	}
	return nil
}

func joinHostPort(host string, port int) string {
	if strings.Contains(host, ":") && !strings.HasPrefix(host, "[") {
		return "[" + host + "]:" + strconv.Itoa(port)
	}
	return host + ":" + strconv.Itoa(port)
}

// expandCounts expands Slurm's compressed counts, "4(x2),3" → [4 4 3].
func expandCounts(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		n, rep := part, 1
		if i := strings.Index(part, "(x"); i >= 0 && strings.HasSuffix(part, ")") {
			var err error
			if rep, err = strconv.Atoi(part[i+2 : len(part)-1]); err != nil || rep < 1 {
				return nil, fmt.Errorf("bad repeat in %q", part)
			}
			n = part[:i]
		}
		v, err := strconv.Atoi(n)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("bad count %q", part)
		}
		for range rep {
			out = append(out, v)
		}
	}
	return out, nil
}
