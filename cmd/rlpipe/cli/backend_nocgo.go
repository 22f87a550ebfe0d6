//go:build !cgo

package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/nccl"
)

// Without cgo there is no CUDA backend and no NCCL: the CPU backend and the
// pure-Go communicators run everything.

var (
	errNoDriver = errors.New("cuda: this rlpipe was built without cgo (CGO_ENABLED=0); the CUDA backend needs it")
	errNoNCCL   = errors.New("nccl: this rlpipe was built without cgo (CGO_ENABLED=0); NCCL needs it")
)

func cudaDeviceCount() (int, error)           { return 0, errNoDriver }
func newCUDABackend(int) (gpu.Backend, error) { return nil, errNoDriver }
func loadNCCL() (string, error)               { return "", errNoNCCL }

func ncclComms([]gpu.Backend) ([]nccl.Comm, error) { return nil, errNoNCCL }

func ncclGroups([]gpu.Backend, int) ([]nccl.Comm, error) { return nil, errNoNCCL }

func ncclRank(context.Context, gpu.Backend, nccl.Comm) (nccl.Comm, error) { return nil, errNoNCCL }

func ncclSplit(context.Context, nccl.Comm, nccl.Comm, int) (nccl.Comm, error) { return nil, errNoNCCL }

func doctorCUDA(env *cli, _ bool) int {
	fmt.Fprintf(env.stdout, "%v\nbackends: cpu\n", errNoDriver)
	return exitOK
}
