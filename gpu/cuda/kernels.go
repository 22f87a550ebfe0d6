//go:build cgo

package cuda

import (
	"embed"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
)

//go:embed kernels/*.cu kernels/*.cuh
var kernelFS embed.FS

// kernelModule is one kernels/*.cu file with the common header prepended.
type kernelModule struct {
	name  string
	src   string
	funcs []string
}

// kernelRE finds the kernels of a module: `extern "C" __global__ void`,
// optionally `__launch_bounds__(...)`, then the name, across line breaks.
var kernelRE = regexp.MustCompile(`extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(`)

// usesHopper finds the line by which a module asks for kernels/hopper.cuh.
var usesHopper = regexp.MustCompile(`(?m)^// uses hopper\.cuh$`)

// partsRE finds the line "// parts: N" by which a file asks to be compiled
// as N modules (see splitParts).
var partsRE = regexp.MustCompile(`(?m)^// parts: ([0-9]+)$`)

// modules lists the embedded kernel modules in name order: each is its
// file (or a part of it, splitParts) with common.cuh before it, and
// hopper.cuh after that where the file has the line "// uses hopper.cuh".
func modules() ([]kernelModule, error) {
	common, err := kernelFS.ReadFile("kernels/common.cuh")
	if err != nil {
		return nil, fmt.Errorf("cuda: embedded kernels: %w", err)
	}
	hopper, err := kernelFS.ReadFile("kernels/hopper.cuh")
	if err != nil {
		return nil, fmt.Errorf("cuda: embedded kernels: %w", err)
	}
	ents, err := kernelFS.ReadDir("kernels")
	if err != nil {
		return nil, fmt.Errorf("cuda: embedded kernels: %w", err)
	}
	var mods []kernelModule
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".cu") {
			continue
		}
		b, err := kernelFS.ReadFile(path.Join("kernels", e.Name()))
		if err != nil {
			return nil, fmt.Errorf("cuda: embedded kernels: %w", err)
		}
		pre := string(common)
		if usesHopper.Match(b) {
			pre += "\n#line 1 \"hopper.cuh\"\n" + string(hopper)
		}
		parts, err := splitParts(e.Name(), string(b))
		if err != nil {
			return nil, err
		}
		for _, p := range parts {
			p.src = pre + "\n#line 1 \"" + e.Name() + "\"\n" + p.src
			mods = append(mods, p)
		}
	}
	sort.Slice(mods, func(i, j int) bool { return mods[i].name < mods[j].name })
	return mods, nil
}

// splitParts returns the modules of kernel file name (source src, without
// the headers): one, named after the file, or with a line "// parts: N"
// N of them, "name.0" to "name.N-1", where part k keeps the k-th, (k+N)-th,
// ... kernels (extern "C" __global__ functions) of the file and has the
// others' definitions blanked (their lines kept empty, so that errors keep
// the file's line numbers). NVRTC compiles the modules in parallel, and a
// template used only by another part's kernels is not instantiated, so a
// large file of template kernels (attention.cu: 43 s alone for sm_90a on
// an H100 host) is no longer the first run's critical path.
func splitParts(name, src string) ([]kernelModule, error) {
	base := strings.TrimSuffix(name, ".cu")
	locs := kernelRE.FindAllStringSubmatchIndex(src, -1)
	n := 1
	if m := partsRE.FindStringSubmatch(src); m != nil {
		n, _ = strconv.Atoi(m[1])
		if n < 1 || n > len(locs) {
			return nil, fmt.Errorf("cuda: embedded kernels: %s: parts: %d for %d kernels", name, n, len(locs))
		}
	}
	if n == 1 {
		m := kernelModule{name: base, src: src}
		for _, l := range locs {
			m.funcs = append(m.funcs, src[l[2]:l[3]])
		}
		return []kernelModule{m}, nil
	}
	// Each kernel's definition runs from "extern" to the brace that
	// closes its body.
	type def struct{ start, end int }
	defs := make([]def, len(locs))
	for i, l := range locs {
		open := strings.IndexByte(src[l[1]:], '{')
		if open < 0 {
			return nil, fmt.Errorf("cuda: embedded kernels: %s: kernel %s has no body", name, src[l[2]:l[3]])
		}
		depth, end := 0, -1
		for j := l[1] + open; j < len(src) && end < 0; j++ {
			switch src[j] {
			case '{':
				depth++
			case '}':
				if depth--; depth == 0 {
					end = j + 1
				}
			}
		}
		if end < 0 {
			return nil, fmt.Errorf("cuda: embedded kernels: %s: kernel %s's body is not closed", name, src[l[2]:l[3]])
		}
		defs[i] = def{l[0], end}
	}
	out := make([]kernelModule, n)
	for k := range out {
		var sb strings.Builder
		at := 0
		m := kernelModule{name: fmt.Sprintf("%s.%d", base, k)}
		for i, d := range defs {
			if i%n == k {
				m.funcs = append(m.funcs, src[locs[i][2]:locs[i][3]])
				continue
			}
			sb.WriteString(src[at:d.start])
			sb.WriteString(strings.Repeat("\n", strings.Count(src[d.start:d.end], "\n")))
			at = d.end
		}
		sb.WriteString(src[at:])
		m.src = sb.String()
		out[k] = m
	}
	return out, nil
}

// compileAll compiles (or fetches from the cache) every module for arch, in
// parallel; NVRTC needs no CUDA context.
func compileAll(arch string, force bool) ([]kernelModule, []kernelImage, error) {
	mods, err := modules()
	if err != nil {
		return nil, nil, err
	}
	imgs := make([]kernelImage, len(mods))
	errs := make([]error, len(mods))
	var wg sync.WaitGroup
	for i, m := range mods {
		wg.Go(func() { imgs[i], errs[i] = compileCached(m.name, m.src, arch, force) })
	}
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return nil, nil, e
		}
	}
	return mods, imgs, nil
}
