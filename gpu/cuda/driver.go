//go:build cgo

package cuda

/*
#include "rlcuda.h"
*/
import "C"

import (
	"fmt"
	"sync"
)

// Driver API constants used by this package.
const (
	attrMultiprocessorCount = 16
	attrUnifiedAddressing   = 41
	attrCCMajor             = 75
	attrCCMinor             = 76
	attrSmemOptin           = 97
	funcAttrStaticSmem      = 1
	funcAttrMaxDynSmem      = 8
	streamNonBlocking       = 1
	eventDisableTiming      = 2
	cudaErrorNotReady       = 600 // CUDA_ERROR_NOT_READY: queried work has not completed
)

// cuErr converts a driver result into an error naming the call.
func cuErr(op string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	name, text := "CUDA_ERROR", "unknown error"
	if s := C.cuErrorName_(r); s != nil {
		name = C.GoString(s)
	}
	if s := C.cuErrorString_(r); s != nil {
		text = C.GoString(s)
	}
	return fmt.Errorf("cuda: %s: %s (%d): %s", op, name, int(r), text)
}

var (
	initOnce sync.Once
	initErr  error
)

// initDriver loads libcuda and calls cuInit once per process.
func initDriver() error {
	initOnce.Do(func() {
		if err := load(libDriver); err != nil {
			initErr = err
			return
		}
		if err := cuErr("cuInit", C.cuInit_(0)); err != nil {
			initErr = fmt.Errorf("%w: %w", ErrNoDriver, err)
			return
		}
		var n C.int
		if err := cuErr("cuDeviceGetCount", C.cuDeviceGetCount_(&n)); err != nil {
			initErr = fmt.Errorf("%w: %w", ErrNoDriver, err)
			return
		}
		if n == 0 {
			initErr = fmt.Errorf("%w: the driver reports no CUDA device", ErrNoDriver)
		}
	})
	return initErr
}

// DeviceInfo describes one CUDA device.
type DeviceInfo struct {
	Index       int
	Name        string
	CCMajor     int
	CCMinor     int
	SMs         int
	MemoryBytes int64
}

// Arch returns the NVRTC architecture name, e.g. "sm_86"; for compute
// capability 9.0 (H100, H200) "sm_90a", the target with the Hopper-only
// instructions (wgmma) that the attention kernels use.
func (d DeviceInfo) Arch() string {
	if d.Hopper() {
		return "sm_90a"
	}
	return fmt.Sprintf("sm_%d%d", d.CCMajor, d.CCMinor)
}

// Hopper reports whether the device is compute capability 9.0, where the
// kernels are built for sm_90a and attention runs on wgmma.
func (d DeviceInfo) Hopper() bool { return d.CCMajor == 9 && d.CCMinor == 0 }

// deviceInfo queries device ordinal i (no context needed).
func deviceInfo(i int) (DeviceInfo, C.CUdevice, error) {
	var dev C.CUdevice
	if err := cuErr("cuDeviceGet", C.cuDeviceGet_(&dev, C.int(i))); err != nil {
		return DeviceInfo{}, 0, err
	}
	var name [256]C.char
	if err := cuErr("cuDeviceGetName", C.cuDeviceGetName_(&name[0], 255, dev)); err != nil {
		return DeviceInfo{}, 0, err
	}
	attr := func(a int) (int, error) {
		var v C.int
		err := cuErr("cuDeviceGetAttribute", C.cuDeviceGetAttribute_(&v, C.int(a), dev))
		return int(v), err
	}
	info := DeviceInfo{Index: i, Name: C.GoString(&name[0])}
	var err error
	if info.CCMajor, err = attr(attrCCMajor); err != nil {
		return info, 0, err
	}
	if info.CCMinor, err = attr(attrCCMinor); err != nil {
		return info, 0, err
	}
	if info.SMs, err = attr(attrMultiprocessorCount); err != nil {
		return info, 0, err
	}
	var mem C.size_t
	if err := cuErr("cuDeviceTotalMem", C.cuDeviceTotalMem_(&mem, dev)); err != nil {
		return info, 0, err
	}
	info.MemoryBytes = int64(mem)
	return info, dev, nil
}
