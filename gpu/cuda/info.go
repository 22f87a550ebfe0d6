//go:build cgo

package cuda

/*
#include "rlcuda.h"
*/
import "C"

import (
	"fmt"
	"strings"
)

// Info reports the CUDA software and devices this package sees.
type Info struct {
	// DriverVersion is cuDriverGetVersion's value (e.g. 13000 for 13.0).
	DriverVersion int
	// NVRTCMajor and NVRTCMinor are nvrtcVersion's values.
	NVRTCMajor, NVRTCMinor int
	// CublasLtVersion is cublasLtGetVersion's value (e.g. 130000).
	CublasLtVersion int
	// Libraries maps each library to the path it was loaded from.
	Libraries map[string]string
	// Devices lists the devices in ordinal order.
	Devices []DeviceInfo
	// KernelCacheDir is where compiled kernels are cached.
	KernelCacheDir string
	// TensorMaps is whether the driver encodes tensor maps
	// (cuTensorMapEncodeTiled, CUDA 12 drivers), which the Hopper
	// attention kernels' TMA loads need.
	TensorMaps bool
}

// String formats the report on several lines.
func (i Info) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "driver %d.%d, nvrtc %d.%d, cublasLt %d\n", i.DriverVersion/1000, i.DriverVersion%1000/10,
		i.NVRTCMajor, i.NVRTCMinor, i.CublasLtVersion)
	for _, k := range []string{libDriver.String(), libNVRTC.String(), libCublasLt.String()} {
		if p, ok := i.Libraries[k]; ok {
			fmt.Fprintf(&sb, "%s: %s\n", k, p)
		}
	}
	for _, d := range i.Devices {
		fmt.Fprintf(&sb, "device %d: %s, compute capability %d.%d, %d SMs, %.1f GiB\n", d.Index, d.Name, d.CCMajor, d.CCMinor,
			d.SMs, float64(d.MemoryBytes)/(1<<30))
	}
	if !i.TensorMaps {
		fmt.Fprintf(&sb, "tensor maps: not in this driver (on Hopper set %s)\n", noTMAEnv)
	}
	fmt.Fprintf(&sb, "kernel cache: %s", i.KernelCacheDir)
	return sb.String()
}

// Versions loads the libraries and reports the driver, NVRTC and cuBLASLt
// versions, where each library was found, and every device's name, compute
// capability and memory. Without a driver it returns an error wrapping
// ErrNoDriver; a missing NVRTC or cuBLASLt is reported as an error too.
func Versions() (Info, error) {
	info := Info{Libraries: map[string]string{}, KernelCacheDir: cacheDir()}
	if err := initDriver(); err != nil {
		return info, err
	}
	info.Libraries[libDriver.String()] = libPath(libDriver)
	var v C.int
	if err := cuErr("cuDriverGetVersion", C.cuDriverGetVersion_(&v)); err != nil {
		return info, err
	}
	info.DriverVersion = int(v)
	info.TensorMaps = C.rl_has_tmap() != 0
	var n C.int
	if err := cuErr("cuDeviceGetCount", C.cuDeviceGetCount_(&n)); err != nil {
		return info, err
	}
	for i := range int(n) {
		d, _, err := deviceInfo(i)
		if err != nil {
			return info, err
		}
		info.Devices = append(info.Devices, d)
	}
	ma, mi, err := NVRTCVersion()
	if err != nil {
		return info, err
	}
	info.NVRTCMajor, info.NVRTCMinor = ma, mi
	info.Libraries[libNVRTC.String()] = libPath(libNVRTC)
	if err := load(libCublasLt); err != nil {
		return info, err
	}
	info.Libraries[libCublasLt.String()] = libPath(libCublasLt)
	info.CublasLtVersion = int(C.ltVersion_())
	return info, nil
}

// KernelStatus describes one compiled kernel module.
type KernelStatus struct {
	// Module is the kernels/*.cu file name without extension.
	Module string
	// Kernels lists the module's entry points.
	Kernels []string
	// Cached reports whether the image came from the disk cache.
	Cached bool
	// PTX reports whether NVRTC produced PTX (an architecture it does not
	// know) instead of a cubin.
	PTX bool
	// Bytes is the size of the image.
	Bytes int
	// CacheKey names the cache entry.
	CacheKey string
}

// CompileAll compiles every embedded kernel module for device dev's
// architecture (for `rlpipe doctor`), filling the disk cache. With force it
// recompiles modules that are already cached. It does not create a context.
func CompileAll(dev int, force bool) ([]KernelStatus, error) {
	if err := initDriver(); err != nil {
		return nil, err
	}
	d, _, err := deviceInfo(dev)
	if err != nil {
		return nil, err
	}
	mods, imgs, err := compileAll(d.Arch(), force)
	if err != nil {
		return nil, err
	}
	out := make([]KernelStatus, len(mods))
	for i, m := range mods {
		out[i] = KernelStatus{Module: m.name, Kernels: m.funcs, Cached: imgs[i].cached, PTX: imgs[i].ptx,
			Bytes: len(imgs[i].data), CacheKey: imgs[i].cacheKey}
	}
	return out, nil
}
