package nccl

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "rlnccl.h"
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"github.com/rlpipe/rlpipe/gpu/cuda"
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
	var last string
	for _, d := range dirs {
		for _, so := range sonames {
			p := so
			if d != "" {
				p = filepath.Join(d, so)
				if _, err := os.Stat(p); err != nil {
					continue
				}
			}
			cp := C.CString(p)
			h := C.rl_nccl_open_(cp)
			C.free(unsafe.Pointer(cp))
			if h == nil {
				if e := C.rl_nccl_dlerror_(); e != nil {
					last = C.GoString(e)
				}
				continue
			}
			if i := int(C.rl_nccl_resolve_(h)); i >= 0 {
				last = p + " lacks symbol " + C.GoString(C.rl_nccl_symname_(C.int(i)))
				continue
			}
			var v C.int
			if r := C.rl_nccl_get_version_(&v); r != 0 {
				return Library{}, fmt.Errorf("nccl: ncclGetVersion in %s returned %d", p, int(r))
			}
			if real := C.rl_nccl_path_(h); real != nil && C.GoString(real) != "" {
				p = C.GoString(real)
			}
			return Library{Path: p, Version: versionString(int(v))}, nil
		}
	}
	shown := make([]string, len(dirs))
	for i, d := range dirs {
		if d == "" {
			d = "(dynamic loader default)"
		}
		shown[i] = d
	}
	if last == "" {
		last = "no candidate file found"
	}
	return Library{}, fmt.Errorf("nccl: cannot load libnccl (tried %s) in %s: %s", strings.Join(sonames, ", "), strings.Join(shown, ", "), last)
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
