package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/nvml"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
)

// loaded is a spec taken through every validation step.
type loaded struct {
	spec *spec.Spec
	job  *stages.Job
}

// gpuFlag registers the --gpu flag on fs.
func gpuFlag(fs *flag.FlagSet) *string {
	return fs.String("gpu", "", "GPU memory: a preset ("+strings.Join(gpu.PresetNames(), ", ")+") or a byte count; default: the spec's mesh.gpu, then NVML")
}

// resolveGPU picks the GPU memory figure: --gpu, then mesh.gpu, then NVML.
func resolveGPU(flagValue string, s *spec.Spec) (stages.GPU, error) {
	if flagValue != "" {
		name, bytes, err := gpu.ParseGPU(flagValue)
		if err != nil {
			return stages.GPU{}, fmt.Errorf("--gpu: %w", err)
		}
		return stages.GPU{Name: name, Bytes: bytes, Source: "--gpu"}, nil
	}
	if s.Mesh.GPU != "" {
		name, bytes, err := gpu.ParseGPU(s.Mesh.GPU)
		if err != nil {
			return stages.GPU{}, spec.Errors{spec.Errorf(s.Mesh.Pos, "mesh.gpu: %v", err)}
		}
		return stages.GPU{Name: name, Bytes: bytes, Source: "spec mesh.gpu"}, nil
	}
	devs, err := nvml.VisibleDevices()
	if err == nil && len(devs) > 0 {
		return stages.GPU{Name: devs[0].Name, Bytes: devs[0].MemoryBytes, Source: "NVML"}, nil
	}
	if err == nil {
		err = errors.New("nvml: no GPUs")
	}
	// No GPU here: plan for the CPU backend, whose "device" is host memory.
	if mem, merr := hostMemory(); merr == nil {
		return stages.GPU{Name: "cpu", Bytes: mem, Source: "no GPU found, so the CPU backend and host RAM; pass --gpu to plan for a GPU"}, nil
	}
	return stages.GPU{}, fmt.Errorf("no GPU memory figure: pass --gpu (one of %s, or bytes) or set mesh.gpu (%v)", strings.Join(gpu.PresetNames(), ", "), err)
}

// hostMemory returns the machine's total RAM from /proc/meminfo.
func hostMemory() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("/proc/meminfo has no MemTotal")
}

// load reads the spec at path and resolves it (see resolveSpec). When the
// spec has errors but its YAML parsed, the partial spec is resolved too, so
// that every problem of the recipe is reported in one pass.
func load(path, gpuValue string, check stages.Check) (*loaded, error) {
	s, err := spec.Load(path)
	if s == nil || err == nil {
		if err != nil {
			return nil, err
		}
		return resolveSpec(s, gpuValue, check)
	}
	all := spec.Errors{}
	all.Append(err)
	if _, rerr := resolveSpec(s, gpuValue, check); rerr != nil {
		all.Append(rerr)
	}
	return nil, all.Err()
}

// resolveSpec validates s in one pass, for a run (CheckRun: weights and
// rollouts required) or a plan (CheckPlan).
func resolveSpec(s *spec.Spec, gpuValue string, check stages.Check) (*loaded, error) {
	dev, err := resolveGPU(gpuValue, s)
	if err != nil {
		return nil, err
	}
	j, err := stages.Resolve(s, dev, check)
	if err != nil {
		return nil, err
	}
	return &loaded{spec: s, job: j}, nil
}

// report prints a load error and returns the exit code for it.
func (env *cli) report(err error) int {
	var se spec.Errors
	if errors.As(err, &se) {
		fmt.Fprintln(env.stderr, se.Error())
		fmt.Fprintf(env.stderr, "%d problem(s)\n", len(se))
		return exitInvalid
	}
	var e *spec.Error
	if errors.As(err, &e) {
		fmt.Fprintln(env.stderr, e.Error())
		if s := e.Snippet(); s != "" {
			fmt.Fprintln(env.stderr, s)
		}
		return exitInvalid
	}
	fmt.Fprintf(env.stderr, "rlpipe: %v\n", err)
	return exitFailed
}

// usageError prints a bad flag value or argument and returns exitUsage.
func (env *cli) usageError(format string, args ...any) int {
	fmt.Fprintf(env.stderr, "rlpipe: "+format+"\n", args...)
	return exitUsage
}

// checkGPUFlag reports a --gpu value that names no preset or byte count.
func checkGPUFlag(v string) error {
	if v == "" {
		return nil
	}
	if _, _, err := gpu.ParseGPU(v); err != nil {
		return fmt.Errorf("--gpu: %w", err)
	}
	return nil
}
