//go:build cuda

// This file is compiled only with `-tags cuda`:
//
//	go build -tags cuda -o .devbin/rlbench ./bench/cmd/rlbench
//
// It needs the package github.com/rlpipe/rlpipe/gpu/cuda (cgo, the CUDA
// toolkit at build time, the driver at run time).

package bench

import (
	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cuda"
)

func init() {
	RegisterBackend("cuda", func(device, _ int) (gpu.Backend, error) {
		b, err := cuda.New(device)
		if err != nil {
			return nil, err // not a typed nil inside the interface
		}
		return b, nil
	})
}
