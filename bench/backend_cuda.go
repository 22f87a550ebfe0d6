//go:build cgo

// The CUDA backend builds with gcc alone (it loads the CUDA libraries at
// run time), so with cgo it is always registered; without a driver cuda.New
// returns an error wrapping cuda.ErrNoDriver. Without cgo only the CPU
// backend is registered.

package bench

import (
	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cuda"
	"github.com/rlpipe/rlpipe/nccl/libnccl"
)

func init() {
	RegisterBackend("cuda", func(device, _ int) (gpu.Backend, error) {
		b, err := cuda.New(device)
		if err != nil {
			return nil, err // not a typed nil inside the interface
		}
		return b, nil
	}, libnccl.NewComms)
}
