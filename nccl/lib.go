package nccl

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>

static void* rl_nccl_open(const char* path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }
static const char* rl_nccl_dlerror(void) { return dlerror(); }
static void* rl_nccl_sym(void* h, const char* name) { return dlsym(h, name); }
static const char* rl_nccl_path(void* h) {
	struct link_map* lm = NULL;
	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || lm == NULL) return NULL;
	return lm->l_name;
}
// rl_nccl_version calls ncclGetVersion through its resolved pointer.
static int rl_nccl_version(void* f, int* v) { return ((int (*)(int*))f)(v); }
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
// and driver directories, NVIDIA's Python wheels), opens it once per process
// and reads its version. The error names every directory tried. rlpipe's
// collectives do not use it yet (the CUDA backend runs one rank);
// `rlpipe doctor` reports it.
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
			h := C.rl_nccl_open(cp)
			C.free(unsafe.Pointer(cp))
			if h == nil {
				if e := C.rl_nccl_dlerror(); e != nil {
					last = C.GoString(e)
				}
				continue
			}
			cs := C.CString("ncclGetVersion")
			f := C.rl_nccl_sym(h, cs)
			C.free(unsafe.Pointer(cs))
			if f == nil {
				last = p + " lacks symbol ncclGetVersion"
				continue
			}
			var v C.int
			if r := C.rl_nccl_version(f, &v); r != 0 {
				return Library{}, fmt.Errorf("nccl: ncclGetVersion in %s returned %d", p, int(r))
			}
			if real := C.rl_nccl_path(h); real != nil && C.GoString(real) != "" {
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
