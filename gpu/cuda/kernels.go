//go:build cgo

package cuda

import (
	"embed"
	"fmt"
	"path"
	"regexp"
	"sort"
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

// modules lists the embedded kernel modules in name order: each is its
// file with common.cuh before it, and hopper.cuh after that where the
// file has the line "// uses hopper.cuh".
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
		m := kernelModule{name: strings.TrimSuffix(e.Name(), ".cu"), src: pre + "\n#line 1 \"" + e.Name() + "\"\n" + string(b)}
		for _, x := range kernelRE.FindAllStringSubmatch(string(b), -1) {
			m.funcs = append(m.funcs, x[1])
		}
		mods = append(mods, m)
	}
	sort.Slice(mods, func(i, j int) bool { return mods[i].name < mods[j].name })
	return mods, nil
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
