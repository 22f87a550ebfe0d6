//go:build cgo

package dl

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>

static void* rl_dl_open(const char* path, int global) {
	return dlopen(path, RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
}
static const char* rl_dl_error(void) { return dlerror(); }
static const char* rl_dl_path(void* h) {
	struct link_map* lm = NULL;
	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || lm == NULL) return NULL;
	return lm->l_name;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"
)

// Handle is an open shared library.
type Handle struct{ p unsafe.Pointer }

// Pointer returns the dlopen handle, for a package's own dlsym table.
func (h Handle) Pointer() unsafe.Pointer { return h.p }

// Path returns the file the library was loaded from ("" if unknown).
func (h Handle) Path() string {
	if p := C.rl_dl_path(h.p); p != nil {
		return C.GoString(p)
	}
	return ""
}

// Open opens the library at path with its symbols resolved now; global
// makes them available to libraries opened later.
func Open(path string, global bool) (Handle, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	g := C.int(0)
	if global {
		g = 1
	}
	h := C.rl_dl_open(cs, g)
	if h == nil {
		if e := C.rl_dl_error(); e != nil {
			return Handle{}, errors.New(C.GoString(e))
		}
		return Handle{}, errors.New("dlopen failed")
	}
	return Handle{p: h}, nil
}

// Find opens library what: the first of sonames, in the first of dirs ("":
// the dynamic loader's own search), that opens and that accept takes
// (accept resolves the caller's symbols; an error moves on to the next
// candidate). It returns the handle and the path it was loaded from. The
// error names what, the file names, every directory tried and the last
// failure.
func Find(what string, sonames, dirs []string, accept func(h Handle, dir string) error) (Handle, string, error) {
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
			h, err := Open(p, false)
			if err != nil {
				last = err.Error()
				continue
			}
			if err := accept(h, d); err != nil {
				last = p + ": " + err.Error()
				continue
			}
			if real := h.Path(); real != "" {
				p = real
			}
			return h, p, nil
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
	return Handle{}, "", fmt.Errorf("cannot load %s (tried %s) in %s: %s", what, strings.Join(sonames, ", "), strings.Join(shown, ", "), last)
}
