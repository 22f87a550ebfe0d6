//go:build cgo

package nvml

import (
	"fmt"
	"os"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Devices lists the GPUs of this host.
func Devices() (devs []Device, err error) {
	defer func() {
		// go-nvml panics when libnvidia-ml cannot be opened on some versions.
		if r := recover(); r != nil {
			devs, err = nil, fmt.Errorf("%w: %v", ErrNoDriver, r)
		}
	}()
	if ret := gonvml.Init(); ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("%w: %s", ErrNoDriver, gonvml.ErrorString(ret))
	}
	defer gonvml.Shutdown()
	n, ret := gonvml.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("nvml: device count: %s", gonvml.ErrorString(ret))
	}
	for i := 0; i < n; i++ {
		d, ret := gonvml.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			return nil, fmt.Errorf("nvml: device %d: %s", i, gonvml.ErrorString(ret))
		}
		name, _ := d.GetName()
		uuid, _ := d.GetUUID()
		// The v2 query also says what the driver reserves; what is left is
		// the total CUDA reports (cuDeviceTotalMem), all a process can use.
		if mem, ret := d.GetMemoryInfo_v2(); ret == gonvml.SUCCESS {
			devs = append(devs, Device{Index: i, Name: name, UUID: uuid, MemoryBytes: int64(mem.Total - mem.Reserved), UsedBytes: int64(mem.Used)})
			continue
		}
		mem, ret := d.GetMemoryInfo()
		if ret != gonvml.SUCCESS {
			return nil, fmt.Errorf("nvml: device %d memory: %s", i, gonvml.ErrorString(ret))
		}
		devs = append(devs, Device{Index: i, Name: name, UUID: uuid, MemoryBytes: int64(mem.Total), UsedBytes: int64(mem.Used)})
	}
	return devs, nil
}

// ProcessMemory returns the device memory NVML attributes to this process on
// GPU index, or an error when NVML cannot tell.
func ProcessMemory(index int) (bytes int64, err error) {
	defer func() {
		if r := recover(); r != nil {
			bytes, err = 0, fmt.Errorf("%w: %v", ErrNoDriver, r)
		}
	}()
	if ret := gonvml.Init(); ret != gonvml.SUCCESS {
		return 0, fmt.Errorf("%w: %s", ErrNoDriver, gonvml.ErrorString(ret))
	}
	defer gonvml.Shutdown()
	d, ret := gonvml.DeviceGetHandleByIndex(index)
	if ret != gonvml.SUCCESS {
		return 0, fmt.Errorf("nvml: device %d: %s", index, gonvml.ErrorString(ret))
	}
	procs, ret := d.GetComputeRunningProcesses()
	if ret != gonvml.SUCCESS {
		return 0, fmt.Errorf("nvml: processes on device %d: %s", index, gonvml.ErrorString(ret))
	}
	pid := uint32(os.Getpid())
	for _, p := range procs {
		if p.Pid == pid {
			return int64(p.UsedGpuMemory), nil
		}
	}
	return 0, fmt.Errorf("nvml: process %d not found on device %d", pid, index)
}
