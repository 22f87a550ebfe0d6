// Package dl finds and opens NVIDIA's shared libraries at run time
// (dlopen), for the CUDA backend and the NCCL binding: one search path, one
// way of opening, one error that names every directory tried. Without cgo
// only the search path is built.
package dl

import (
	"os"
	"path/filepath"
	"sort"
)

// SearchDirs returns the directories searched for NVIDIA's libraries, in
// order: $RLPIPE_CUDA_LIB_DIR, $LD_LIBRARY_PATH, "" (the dynamic loader's
// default search), the usual toolkit and driver directories, and the lib
// folders of NVIDIA's Python wheels (site-packages/nvidia/*/lib).
func SearchDirs() []string {
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
