//go:build cgo

package libnccl

/*
#cgo LDFLAGS: -ldl
#include "rlnccl.h"
*/
import "C"

import (
	"fmt"
	"sync"

	"github.com/rlpipe/rlpipe/gpu/cuda"
	"github.com/rlpipe/rlpipe/gpu/cuda/dl"
)

// Library describes the NCCL shared library found on this machine.
type Library struct {
	// Path is the file it was loaded from.
	Path string
	// Version is major.minor.patch, from ncclGetVersion.
	Version string
}

// sonames are the file names tried for libnccl, in order.
var sonames = []string{"libnccl.so.2", "libnccl.so"}

var (
	libOnce sync.Once
	lib     Library
	libErr  error
)

// Load finds libnccl in the directories the CUDA backend searches
// ($RLPIPE_CUDA_LIB_DIR, $LD_LIBRARY_PATH, the loader's default, the toolkit
// and driver directories, NVIDIA's Python wheels), opens it once per process,
// resolves the functions NewCUDA needs and reads its version. The error
// names every directory tried.
func Load() (Library, error) {
	libOnce.Do(func() { lib, libErr = load(cuda.LibraryDirs()) })
	return lib, libErr
}

func load(dirs []string) (Library, error) {
	_, p, err := dl.Find("libnccl", sonames, dirs, func(h dl.Handle, _ string) error {
		if i := int(C.rl_nccl_resolve_(h.Pointer())); i >= 0 {
			return fmt.Errorf("lacks symbol %s", C.GoString(C.rl_nccl_symname_(C.int(i))))
		}
		return nil
	})
	if err != nil {
		return Library{}, fmt.Errorf("nccl: %w", err)
	}
	var v C.int
	if r := C.rl_nccl_get_version_(&v); r != 0 {
		return Library{}, fmt.Errorf("nccl: ncclGetVersion in %s returned %d", p, int(r))
	}
	return Library{Path: p, Version: versionString(int(v))}, nil
}

// versionString decodes NCCL_VERSION_CODE: major*10000 + minor*100 + patch
// since NCCL 2.9, major*1000 + minor*100 + patch before.
func versionString(code int) string {
	if code >= 20900 {
		return fmt.Sprintf("%d.%d.%d", code/10000, code%10000/100, code%100)
	}
	return fmt.Sprintf("%d.%d.%d", code/1000, code%1000/100, code%100)
}

// ncclErr turns an ncclResult_t into an error (nil for ncclSuccess).
func ncclErr(op string, r C.int) error {
	if r == 0 {
		return nil
	}
	return fmt.Errorf("nccl: %s: %s (%d)", op, C.GoString(C.rl_nccl_error_string_(r)), int(r))
}
