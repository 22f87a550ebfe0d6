//go:build cgo

package cuda

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "rlcuda.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"sync"

	"github.com/rlpipe/rlpipe/gpu/cuda/dl"
)

// ErrNoDriver means the CUDA driver (libcuda.so.1) could not be loaded or
// initialised, or it reports no device. Tests and callers that can fall back
// to the CPU backend check for it with errors.Is.
var ErrNoDriver = errors.New("cuda: no driver")

// library identifies one of the dynamically loaded libraries.
type library int

const (
	libDriver library = iota
	libNVRTC
	libCublasLt
)

func (l library) String() string {
	switch l {
	case libDriver:
		return "libcuda (driver API)"
	case libNVRTC:
		return "libnvrtc (runtime compilation)"
	}
	return "libcublasLt (matrix products)"
}

// sonames lists the file names tried for each library, in order.
func (l library) sonames() []string {
	switch l {
	case libDriver:
		return []string{"libcuda.so.1", "libcuda.so"}
	case libNVRTC:
		return []string{"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"}
	}
	return []string{"libcublasLt.so", "libcublasLt.so.13", "libcublasLt.so.12"}
}

// loaded records a successfully loaded library.
type loaded struct {
	path string
	err  error
}

var (
	libOnce [3]sync.Once
	libs    [3]loaded
)

// LibraryDirs returns the directories searched for NVIDIA's libraries, in
// search order (dl.SearchDirs); "" stands for the dynamic loader's default
// search. The NCCL binding looks for libnccl in the same places.
func LibraryDirs() []string { return dl.SearchDirs() }

// load dlopens l (once per process) and resolves its symbol table.
func load(l library) error {
	libOnce[l].Do(func() { libs[l] = doLoad(l) })
	return libs[l].err
}

// libPath returns the path l was loaded from, or "" when it is not loaded.
func libPath(l library) string {
	if libs[l].err != nil {
		return ""
	}
	return libs[l].path
}

func doLoad(l library) loaded {
	_, p, err := dl.Find(l.String(), l.sonames(), dl.SearchDirs(), func(h dl.Handle, dir string) error {
		if l == libNVRTC && dir != "" {
			// NVRTC dlopens its builtins library by soname; loading the
			// one beside it first makes that lookup find it.
			m, _ := filepath.Glob(filepath.Join(dir, "libnvrtc-builtins.so*"))
			sort.Strings(m)
			for _, b := range m {
				if _, err := dl.Open(b, true); err == nil {
					break
				}
			}
		}
		if i := int(C.rl_resolve(C.int(l), h.Pointer())); i >= 0 {
			return fmt.Errorf("lacks symbol %s", C.GoString(C.rl_symname(C.int(l), C.int(i))))
		}
		return nil
	})
	if err != nil {
		err = fmt.Errorf("cuda: %w", err)
		if l == libDriver {
			err = fmt.Errorf("%w: %w", ErrNoDriver, err)
		}
		return loaded{err: err}
	}
	return loaded{path: p}
}
