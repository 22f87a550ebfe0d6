package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/nvml"
	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
)

// backendFlag registers --backend on fs.
func backendFlag(fs *flag.FlagSet) *string {
	return fs.String("backend", "auto", "compute backend: cpu, cuda, or auto (cuda when a driver and GPU are found, else cpu)")
}

// backendChoice is what --backend resolves to: a per-rank constructor (nil:
// the engine's CPU default), the ranks' communicator (nil: the loopback),
// with mesh.cp > 1 the communicators of the cp groups (nil: loopbacks),
// the NVML reading of a rank's device memory (nil on the CPU) and the
// backend's name.
type backendChoice struct {
	newBackend   func(rank int) (gpu.Backend, error)
	comms        func(bs []gpu.Backend) ([]nccl.Comm, error)
	cpComms      func(bs []gpu.Backend) ([]nccl.Comm, error)
	deviceMemory func(rank int) (int64, bool)
	name         string
	// gpus are the GPUs of this host that the process's ranks run on (the
	// CUDA backend); fallback is set when --backend auto found none and
	// chose the CPU.
	gpus     []int
	fallback bool
}

// chooseBackend resolves --backend for spec s. In one process (proc nil),
// rank r runs on GPU r and dp > 1 connects the ranks with NCCL; every rank
// needs its own GPU of this host. With a process per rank, the process
// runs on the GPU of its local rank (GPU 0 when it sees one), and its
// communicator joins the others: NCCL bootstrapped through the control
// communicator, or that communicator itself on the CPU. With mesh.cp > 1
// its cp group gets a TCP communicator split from the control one
// (process.cpGroup): on the CPU it is the group's communicator, on GPUs it
// carries the host side of the group's NCCL communicator, split from the
// world's.
func chooseBackend(name string, s *spec.Spec, proc *process) (backendChoice, error) {
	cp := s.Mesh.CPSize()
	cpuChoice := backendChoice{name: "cpu"}
	if proc != nil {
		cpuChoice.comms = func([]gpu.Backend) ([]nccl.Comm, error) { return []nccl.Comm{proc.ctl}, nil }
		if cp > 1 {
			cpuChoice.cpComms = func([]gpu.Backend) ([]nccl.Comm, error) {
				c, err := proc.cpGroup(context.Background(), cp)
				if err != nil {
					proc.abort(err)
					return nil, err
				}
				return []nccl.Comm{c}, nil
			}
		}
	}
	switch name {
	case "cpu":
		return cpuChoice, nil
	case "auto", "cuda":
		n, err := cudaDeviceCount()
		if err != nil || n == 0 {
			if name == "auto" && (err == nil || errors.Is(err, errNoDriver)) {
				cpuChoice.fallback = true
				return cpuChoice, nil
			}
			if err == nil {
				err = errors.New("no CUDA devices")
			}
			return backendChoice{}, fmt.Errorf("--backend cuda: %w", err)
		}
		world := s.Mesh.WorldSize()
		if proc != nil {
			dev := 0
			if n > 1 {
				dev = proc.w.LocalRank
			}
			if dev >= n {
				return backendChoice{}, fmt.Errorf("--backend cuda: %slocal rank %d and this process sees %d GPUs", proc.who(), proc.w.LocalRank, n)
			}
			if _, err := loadNCCL(); err != nil {
				return backendChoice{}, fmt.Errorf("--backend cuda: %d processes need NCCL: %w", proc.w.Size, err)
			}
			var rankComm nccl.Comm // the rank's NCCL communicator, which its cp group's is split from
			choice := backendChoice{
				name:         "cuda",
				gpus:         []int{dev},
				newBackend:   func(int) (gpu.Backend, error) { return newCUDABackend(dev) },
				deviceMemory: func(int) (int64, bool) { return deviceMemory(dev) },
				comms: func(bs []gpu.Backend) ([]nccl.Comm, error) {
					c, err := ncclRank(context.Background(), bs[0], proc.ctl)
					if err != nil {
						return nil, err
					}
					rankComm = c
					return []nccl.Comm{c}, nil
				},
			}
			if cp > 1 {
				// Called after comms (stages.Run makes the ranks'
				// communicators first).
				choice.cpComms = func([]gpu.Backend) ([]nccl.Comm, error) {
					if rankComm == nil {
						return nil, errors.New("the cp group's NCCL communicator is split from the rank's, which is not there yet")
					}
					host, err := proc.cpGroup(context.Background(), cp)
					if err != nil {
						proc.abort(err)
						return nil, err
					}
					g, err := ncclSplit(context.Background(), rankComm, host, proc.w.Rank/cp)
					if err != nil {
						host.Close()
						proc.abort(err)
						return nil, err
					}
					return []nccl.Comm{g}, nil // closing it closes host
				}
			}
			return choice, nil
		}
		c := backendChoice{name: "cuda", newBackend: func(rank int) (gpu.Backend, error) { return newCUDABackend(rank) }, deviceMemory: deviceMemory}
		for r := range world {
			c.gpus = append(c.gpus, r)
		}
		if world <= 1 {
			return c, nil
		}
		if err := checkGPUMesh(s.Mesh.Nodes, world, n); err != nil {
			return backendChoice{}, err
		}
		if _, err := loadNCCL(); err != nil {
			return backendChoice{}, fmt.Errorf("--backend cuda: %d ranks need NCCL: %w", world, err)
		}
		c.comms = ncclComms
		if cp > 1 {
			// Each cp group gets its own NCCL communicator, whose sends
			// and receives pass keys and values round the group's ring.
			c.cpComms = func(bs []gpu.Backend) ([]nccl.Comm, error) { return ncclGroups(bs, cp) }
		}
		return c, nil
	default:
		return backendChoice{}, fmt.Errorf("--backend: unknown backend %q (cpu, cuda, auto)", name)
	}
}

// describe names the devices the process's ranks run on: "cpu (16
// threads)" ("cpu (16 threads, 8 per rank)" for several ranks), or the
// GPUs with NVML's names, "GPU 0 (NVIDIA H100 80GB HBM3)", "GPUs 0-7
// (8× NVIDIA H100 80GB HBM3)". threads is a rank's share of the CPU
// (RunOptions.Threads; 0: the process's cores over its ranks), ranks the
// ranks the process runs.
func (c backendChoice) describe(threads, ranks int) string {
	if c.name != "cuda" {
		if threads <= 0 {
			threads = max(1, runtime.GOMAXPROCS(0)/max(1, ranks))
			if ranks > 1 {
				return fmt.Sprintf("cpu (%d threads, %d per rank)", runtime.GOMAXPROCS(0), threads)
			}
		}
		return fmt.Sprintf("cpu (%d threads)", threads)
	}
	if len(c.gpus) == 0 {
		return "cuda"
	}
	names := map[string]int{}
	var order []string
	if devs, err := nvml.VisibleDevices(); err == nil {
		for _, g := range c.gpus {
			if g < len(devs) {
				if names[devs[g].Name] == 0 {
					order = append(order, devs[g].Name)
				}
				names[devs[g].Name]++
			}
		}
	}
	var which []string
	for _, n := range order {
		if names[n] > 1 {
			n = fmt.Sprintf("%d× %s", names[n], n)
		}
		which = append(which, n)
	}
	ids := fmt.Sprintf("GPU %d", c.gpus[0])
	if last := c.gpus[len(c.gpus)-1]; len(c.gpus) > 1 {
		ids = fmt.Sprintf("GPUs %d-%d", c.gpus[0], last)
	}
	if len(which) == 0 {
		return ids
	}
	return ids + " (" + strings.Join(which, ", ") + ")"
}

// fallbackNotice is the warning for a run that --backend auto put on the
// CPU, no CUDA device found, although g, what the job was planned for,
// is a GPU: the plan was checked against that GPU's memory, not the
// host's. It is empty when there is nothing to say.
func fallbackNotice(c backendChoice, g stages.GPU) string {
	if !c.fallback || g.Name == "cpu" {
		return ""
	}
	return fmt.Sprintf("no CUDA device found, so the CPU backend runs this job planned for %s (%s, %s GiB): its arena is in host memory (--backend cuda requires a GPU)",
		g.Name, g.Source, plan.GiB(g.Bytes))
}

// deviceMemory reads the device memory the process uses on CUDA device
// index, from NVML (through CUDA_VISIBLE_DEVICES): the process's own figure
// when NVML attributes one, else the device's used memory. ok is false
// without NVML.
func deviceMemory(index int) (bytes int64, ok bool) {
	if n, err := nvml.ProcessMemoryOf(index); err == nil {
		return n, true
	}
	devs, err := nvml.VisibleDevices()
	if err != nil || index >= len(devs) {
		return 0, false
	}
	return devs[index].UsedBytes, true
}

func cmdDoctor(_ context.Context, env *cli, args []string) int {
	fs := newFlagSet("doctor", "Usage: rlpipe doctor [--force]\n\nReports the CUDA driver, NVRTC, cuBLASLt and NCCL versions and where they\nwere found, the GPUs (CUDA and NVML), and compiles every kernel once for GPU 0\n(filling the kernel cache). Without a driver it says so: the CPU backend\nneeds none of it.\n\n")
	force := fs.Bool("force", false, "recompile kernels that are already cached")
	if code, ok := parseFlags(fs, env, args); !ok {
		return code
	}
	fmt.Fprintf(env.stdout, "rlpipe %s\n", version)
	if devs, err := nvml.Devices(); err != nil {
		fmt.Fprintln(env.stdout, err) // "nvml: ..."
	} else {
		for _, d := range devs {
			fmt.Fprintf(env.stdout, "nvml: GPU %d %s, %.1f GiB, %s\n", d.Index, d.Name, float64(d.MemoryBytes)/(1<<30), d.UUID)
		}
		if v, set := os.LookupEnv("CUDA_VISIBLE_DEVICES"); set {
			seen, err := nvml.Visible(devs, v, set)
			var m []string
			for k, d := range seen {
				m = append(m, fmt.Sprintf("CUDA %d = NVML %d", k, d.Index))
			}
			switch {
			case err != nil:
				fmt.Fprintln(env.stdout, err)
			case len(m) == 0:
				fmt.Fprintf(env.stdout, "CUDA_VISIBLE_DEVICES=%q: no GPU visible to CUDA\n", v)
			default:
				fmt.Fprintf(env.stdout, "CUDA_VISIBLE_DEVICES=%q: %s\n", v, strings.Join(m, ", "))
			}
		}
	}
	if l, err := loadNCCL(); err != nil {
		fmt.Fprintln(env.stdout, err) // "nccl: cannot load libnccl ..."
	} else {
		fmt.Fprintf(env.stdout, "nccl: %s\n", l)
	}
	return doctorCUDA(env, *force)
}

// checkGPUMesh says whether a mesh of nodes hosts and ranks (dp × cp) can
// run on this host's gpus GPUs: one node, a GPU for every rank.
func checkGPUMesh(nodes, ranks, gpus int) error {
	if nodes > 1 {
		return fmt.Errorf("--backend cuda: this spec has %d nodes; one process runs the ranks of one host: start a process per rank with a launcher (torchrun, srun; see docs/running.md)", nodes)
	}
	if ranks > gpus {
		return fmt.Errorf("--backend cuda: this spec has %d ranks (dp × cp) and this host has %d GPUs; every rank needs its own (use --backend cpu to run it on the CPU)", ranks, gpus)
	}
	return nil
}
