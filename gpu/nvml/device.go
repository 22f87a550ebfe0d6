// Package nvml reads the GPU inventory through NVIDIA's management library.
// It degrades cleanly: on a machine without the driver, Devices returns an
// error that says so, and callers fall back to --gpu presets. NVML needs
// cgo; built without it, every call returns ErrNoDriver.
package nvml

import "errors"

// ErrNoDriver means NVML could not be loaded or initialised.
var ErrNoDriver = errors.New("nvml: no NVIDIA driver found")

// Device is one GPU as NVML reports it.
type Device struct {
	Index int
	Name  string
	UUID  string
	// MemoryBytes is the memory a process can use: the total less what the
	// driver reserves (NVML's v2 memory query; the total where the driver
	// lacks it). It equals CUDA's total (cuDeviceTotalMem).
	MemoryBytes int64
	UsedBytes   int64
}
