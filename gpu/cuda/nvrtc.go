//go:build cgo

package cuda

/*
#include <stdlib.h>
#include "rlcuda.h"
*/
import "C"

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"unsafe"
)

// compiles counts NVRTC compilations in this process (the kernel cache test
// checks that a second backend compiles nothing).
var compiles atomic.Int64

// nvrtcErrInvalidOption is NVRTC_ERROR_INVALID_OPTION.
const nvrtcErrInvalidOption = 5

// NVRTCVersion returns the NVRTC version (major, minor), loading the library
// if needed.
func NVRTCVersion() (int, int, error) {
	if err := load(libNVRTC); err != nil {
		return 0, 0, err
	}
	var a, b C.int
	if r := C.nvrtcVersion_(&a, &b); r != 0 {
		return 0, 0, nvErr("nvrtcVersion", r, "")
	}
	return int(a), int(b), nil
}

func nvErr(op string, r C.nvrtcResult, log string) error {
	msg := fmt.Sprintf("cuda: %s: %s (%d)", op, C.GoString(C.nvrtcErrorText(r)), int(r))
	if log = strings.TrimSpace(log); log != "" {
		msg += "\n" + log
	}
	return fmt.Errorf("%s", msg)
}

// cacheDir returns the kernel cache directory: $RLPIPE_CACHE_DIR/kernels, or
// os.UserCacheDir()/rlpipe/kernels, or a folder under os.TempDir().
func cacheDir() string {
	if d := os.Getenv("RLPIPE_CACHE_DIR"); d != "" {
		return filepath.Join(d, "kernels")
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "rlpipe", "kernels")
	}
	return filepath.Join(os.TempDir(), "rlpipe-cache", "kernels")
}

// compileOptions are the NVRTC options for an architecture such as "sm_90".
// FMA contraction is off so that float32 expressions round as the CPU
// reference's do; kernels use explicit fmaf where order does not matter.
func compileOptions(arch string) []string {
	o := []string{"--gpu-architecture=" + arch, "-default-device", "-std=c++17", "--fmad=false"}
	if compileLog {
		o = append(o, "--ptxas-options=-v")
	}
	return o
}

// compileLog (RLPIPE_CUDA_COMPILE_LOG=1) has ptxas report each kernel's
// registers, spills and shared memory, and writes NVRTC's log of every
// module compiled to standard error: a kernel developer's check that a
// kernel neither spills nor has its asynchronous MMAs serialised.
var compileLog = os.Getenv("RLPIPE_CUDA_COMPILE_LOG") == "1"

// kernelImage is a compiled module: a cubin, or PTX for the driver to JIT.
type kernelImage struct {
	data     []byte
	ptx      bool
	cached   bool
	cacheKey string
}

// compileCached returns the image of module name (source src) for arch,
// from the disk cache when present; the key hashes the source, the options,
// the architecture and the NVRTC version. force skips the cache lookup.
func compileCached(name, src, arch string, force bool) (kernelImage, error) {
	ma, mi, err := NVRTCVersion()
	if err != nil {
		return kernelImage{}, err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00nvrtc %d.%d\x00", src, strings.Join(compileOptions(arch), " "), arch, ma, mi)
	key := name + "-" + arch + "-" + hex.EncodeToString(h.Sum(nil))[:24]
	dir := cacheDir()
	if !force {
		for _, ext := range []string{".cubin", ".ptx"} {
			if b, err := os.ReadFile(filepath.Join(dir, key+ext)); err == nil && len(b) > 0 {
				return kernelImage{data: b, ptx: ext == ".ptx", cached: true, cacheKey: key}, nil
			}
		}
	}
	img, err := compile(name, src, arch)
	if err != nil {
		return kernelImage{}, err
	}
	img.cacheKey = key
	ext := ".cubin"
	if img.ptx {
		ext = ".ptx"
	}
	// The cache is an optimisation: failures to write it are ignored.
	if os.MkdirAll(dir, 0o755) == nil {
		if f, err := os.CreateTemp(dir, key+".tmp*"); err == nil {
			_, werr := f.Write(img.data)
			cerr := f.Close()
			if werr == nil && cerr == nil {
				_ = os.Rename(f.Name(), filepath.Join(dir, key+ext))
			} else {
				_ = os.Remove(f.Name())
			}
		}
	}
	return img, nil
}

// compile runs NVRTC on src for arch. When NVRTC does not know the real
// architecture (a device newer than the library), it retries with the
// virtual one and returns PTX.
func compile(name, src, arch string) (kernelImage, error) {
	img, r, err := compileArch(name, src, arch, false)
	if err != nil && r == nvrtcErrInvalidOption && strings.HasPrefix(arch, "sm_") {
		img, _, err = compileArch(name, src, "compute_"+strings.TrimPrefix(arch, "sm_"), true)
	}
	return img, err
}

func compileArch(name, src, arch string, ptx bool) (kernelImage, C.nvrtcResult, error) {
	compiles.Add(1)
	csrc := C.CString(src)
	defer C.free(unsafe.Pointer(csrc))
	cname := C.CString(name + ".cu")
	defer C.free(unsafe.Pointer(cname))
	var prog C.uint64_t
	if r := C.nvrtcCreateProgram_(&prog, csrc, cname); r != 0 {
		return kernelImage{}, r, nvErr("nvrtcCreateProgram "+name, r, "")
	}
	defer C.nvrtcDestroyProgram_(prog)
	opts := compileOptions(arch)
	copts := (**C.char)(C.malloc(C.size_t(len(opts)) * C.size_t(unsafe.Sizeof(uintptr(0)))))
	defer C.free(unsafe.Pointer(copts))
	cs := unsafe.Slice(copts, len(opts))
	for i, o := range opts {
		cs[i] = C.CString(o)
		defer C.free(unsafe.Pointer(cs[i]))
	}
	r := C.nvrtcCompileProgram_(prog, C.int(len(opts)), copts)
	var logSize C.size_t
	log := ""
	if C.nvrtcGetProgramLogSize_(prog, &logSize) == 0 && logSize > 1 {
		buf := make([]byte, logSize)
		if C.nvrtcGetProgramLog_(prog, (*C.char)(unsafe.Pointer(&buf[0]))) == 0 {
			log = strings.TrimRight(string(buf), "\x00")
		}
	}
	if r != 0 {
		return kernelImage{}, r, nvErr(fmt.Sprintf("compiling kernels/%s.cu for %s (options %s)", name, arch, strings.Join(opts, " ")), r, log)
	}
	if compileLog && log != "" {
		fmt.Fprintf(os.Stderr, "kernels/%s.cu for %s:\n%s\n", name, arch, log)
	}
	var n C.size_t
	if ptx {
		if r := C.nvrtcGetPTXSize_(prog, &n); r != 0 {
			return kernelImage{}, r, nvErr("nvrtcGetPTXSize", r, "")
		}
		buf := make([]byte, n)
		if r := C.nvrtcGetPTX_(prog, (*C.char)(unsafe.Pointer(&buf[0]))); r != 0 {
			return kernelImage{}, r, nvErr("nvrtcGetPTX", r, "")
		}
		return kernelImage{data: buf, ptx: true}, 0, nil
	}
	if r := C.nvrtcGetCUBINSize_(prog, &n); r != 0 {
		return kernelImage{}, r, nvErr("nvrtcGetCUBINSize", r, "")
	}
	if n == 0 {
		return kernelImage{}, 0, fmt.Errorf("cuda: nvrtc produced an empty cubin for %s", name)
	}
	buf := make([]byte, n)
	if r := C.nvrtcGetCUBIN_(prog, (*C.char)(unsafe.Pointer(&buf[0]))); r != 0 {
		return kernelImage{}, r, nvErr("nvrtcGetCUBIN", r, "")
	}
	return kernelImage{data: buf}, 0, nil
}
