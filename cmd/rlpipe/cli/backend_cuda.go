//go:build cgo

package cli

import (
	"errors"
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cuda"
	"github.com/rlpipe/rlpipe/nccl/libnccl"
)

// The CUDA backend and NCCL, built with cgo (backend_nocgo.go stands in
// without it).

// errNoDriver is what cudaDeviceCount's error wraps when no GPU can be
// used here: --backend auto then falls back to the CPU.
var errNoDriver = cuda.ErrNoDriver

// cudaDeviceCount returns the number of CUDA devices.
func cudaDeviceCount() (int, error) {
	info, err := cuda.Versions()
	if err != nil {
		return 0, err
	}
	return len(info.Devices), nil
}

// newCUDABackend returns a CUDA backend on GPU dev.
func newCUDABackend(dev int) (gpu.Backend, error) { return cuda.New(dev) }

// loadNCCL loads libnccl and says which: "version (path)".
func loadNCCL() (string, error) {
	l, err := libnccl.Load()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s (%s)", l.Version, l.Path), nil
}

// ncclComms connects the GPUs of one process, ncclGroups its GPUs' cp
// groups; ncclRank joins this process's rank to the others', and
// ncclSplit its cp group's.
var (
	ncclComms  = libnccl.NewComms
	ncclGroups = libnccl.NewGroups
	ncclRank   = libnccl.NewRank
	ncclSplit  = libnccl.Split
)

// doctorCUDA reports the CUDA libraries and GPUs and compiles every kernel
// for GPU 0.
func doctorCUDA(env *cli, force bool) int {
	info, err := cuda.Versions()
	if err != nil {
		if errors.Is(err, cuda.ErrNoDriver) {
			fmt.Fprintf(env.stdout, "%v\nbackends: cpu (the CUDA backend needs an NVIDIA driver)\n", err) // "cuda: no driver: ..."
			return exitOK
		}
		fmt.Fprintf(env.stderr, "rlpipe doctor: %v\n", err)
		return exitFailed
	}
	fmt.Fprintln(env.stdout, info.String())
	if len(info.Devices) == 0 {
		fmt.Fprintln(env.stdout, "backends: cpu (no CUDA devices)")
		return exitOK
	}
	st, err := cuda.CompileAll(0, force)
	for _, k := range st {
		how := "compiled"
		if k.Cached {
			how = "cached"
		}
		fmt.Fprintf(env.stdout, "kernels %-12s %-8s %7d bytes  %d entry points\n", k.Module, how, k.Bytes, len(k.Kernels))
	}
	if err != nil {
		fmt.Fprintf(env.stderr, "rlpipe doctor: %v\n", err)
		return exitFailed
	}
	fmt.Fprintln(env.stdout, "backends: cpu, cuda")
	return exitOK
}
