//go:build cgo

package model

import (
	"errors"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cuda"
)

// The parity tests also run on GPU 0 through the CUDA backend, against the
// same HF goldens and tolerances. Without a driver each CUDA subtest skips
// and says why.
func init() {
	testBackends = append(testBackends, struct {
		name string
		new  func(t *testing.T) gpu.Backend
	}{"cuda", func(t *testing.T) gpu.Backend {
		b, err := cuda.New(0)
		if err != nil {
			if errors.Is(err, cuda.ErrNoDriver) {
				t.Skipf("cuda: no driver, GPU parity skipped: %v", err)
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}})
}
