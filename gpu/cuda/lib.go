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
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"unsafe"
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
// search order (see searchDirs); "" stands for the dynamic loader's default
// search. Package nccl looks for libnccl in the same places.
func LibraryDirs() []string { return searchDirs() }

// searchDirs returns the directories searched for the CUDA libraries, in
// order: $RLPIPE_CUDA_LIB_DIR, $LD_LIBRARY_PATH, "" (the dynamic loader's
// default search), the usual toolkit and driver directories, and the lib
// folders of NVIDIA's Python wheels (site-packages/nvidia/*/lib).
func searchDirs() []string {
	var dirs []string
	add := func(d string) {
		for _, x := range dirs {
			if x == d {
				return
			}
		}
		dirs = append(dirs, d)
	}
	if d := os.Getenv("RLPIPE_CUDA_LIB_DIR"); d != "" {
		for _, x := range filepath.SplitList(d) {
			if x != "" {
				add(x)
			}
		}
	}
	for _, x := range filepath.SplitList(os.Getenv("LD_LIBRARY_PATH")) {
		if x != "" {
			add(x)
		}
	}
	add("")
	for _, d := range []string{
		"/usr/local/cuda/lib64",
		"/usr/local/cuda/targets/x86_64-linux/lib",
		"/usr/lib/x86_64-linux-gnu",
		"/usr/local/nvidia/lib64",
		"/usr/lib64",
	} {
		add(d)
	}
	var roots []string
	if v := os.Getenv("VIRTUAL_ENV"); v != "" {
		roots = append(roots, filepath.Join(v, "lib", "python3*", "site-packages"))
	}
	if h, err := os.UserHomeDir(); err == nil {
		roots = append(roots, filepath.Join(h, ".local", "lib", "python3*", "site-packages"))
	}
	roots = append(roots,
		"/opt/*/.venv/lib/python3*/site-packages",
		"/opt/*/lib/python3*/site-packages",
		"/usr/local/lib/python3*/dist-packages",
		"/usr/local/lib/python3*/site-packages",
		"/usr/lib/python3/dist-packages",
		"/usr/lib/python3*/site-packages",
	)
	for _, r := range roots {
		for _, pat := range []string{filepath.Join(r, "nvidia", "*", "lib"), filepath.Join(r, "nvidia", "*", "*", "lib")} {
			m, _ := filepath.Glob(pat)
			sort.Strings(m)
			for _, d := range m {
				add(d)
			}
		}
	}
	return dirs
}

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
	dirs := searchDirs()
	var lastErr string
	for _, d := range dirs {
		for _, so := range l.sonames() {
			p := so
			if d != "" {
				p = filepath.Join(d, so)
				if _, err := os.Stat(p); err != nil {
					continue
				}
			}
			h, msg := dlopen(p, false)
			if h == nil {
				lastErr = msg
				continue
			}
			if l == libNVRTC && d != "" {
				// NVRTC dlopens its builtins library by soname; loading the
				// one beside it first makes that lookup find it.
				m, _ := filepath.Glob(filepath.Join(d, "libnvrtc-builtins.so*"))
				sort.Strings(m)
				for _, b := range m {
					if bh, _ := dlopen(b, true); bh != nil {
						break
					}
				}
			}
			if i := int(C.rl_resolve(C.int(l), h)); i >= 0 {
				name := C.GoString(C.rl_symname(C.int(l), C.int(i)))
				lastErr = fmt.Sprintf("%s lacks symbol %s", p, name)
				continue
			}
			if real := C.rl_dlpath(h); real != nil && C.GoString(real) != "" {
				p = C.GoString(real)
			}
			return loaded{path: p}
		}
	}
	shown := make([]string, len(dirs))
	for i, d := range dirs {
		if d == "" {
			d = "(dynamic loader default)"
		}
		shown[i] = d
	}
	err := fmt.Errorf("cuda: cannot load %s (tried %s) in %s: %s",
		l, strings.Join(l.sonames(), ", "), strings.Join(shown, ", "), orNone(lastErr))
	if l == libDriver {
		err = fmt.Errorf("%w: %w", ErrNoDriver, err)
	}
	return loaded{err: err}
}

func orNone(s string) string {
	if s == "" {
		return "no candidate file found"
	}
	return s
}

func dlopen(path string, global bool) (unsafe.Pointer, string) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	g := C.int(0)
	if global {
		g = 1
	}
	h := C.rl_dlopen(cs, g)
	if h == nil {
		if e := C.rl_dlerror(); e != nil {
			return nil, C.GoString(e)
		}
		return nil, "dlopen failed"
	}
	return h, ""
}
