package nvml

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// NVML lists every GPU of the host by its own index; CUDA numbers only the
// GPUs CUDA_VISIBLE_DEVICES lets the process see, in the order it names
// them. A launcher that gives each process its GPU that way (Slurm's
// --gpus-per-task, many Kubernetes setups) makes CUDA device 0 some other
// NVML index. Visible maps one numbering onto the other, so that memory is
// read on the GPU the process computes on.

// Visible returns the devices CUDA sees, in CUDA's order, given the value
// of CUDA_VISIBLE_DEVICES (set reports whether it is set at all) and the
// host's devices in NVML's order. It follows CUDA's reading of the
// variable: a comma-separated list of indices or UUIDs (GPU-..., a unique
// prefix enough); an empty value hides every GPU; the list ends at the
// first entry that names no device, and a device named twice ends it too.
// Indices are NVML's, which is CUDA's order when CUDA_DEVICE_ORDER is
// PCI_BUS_ID and, on a host of identical GPUs, by default. MIG instances
// (MIG-...) are not devices NVML lists here: an error says so.
func Visible(devs []Device, value string, set bool) ([]Device, error) {
	if !set {
		return devs, nil
	}
	var out []Device
	seen := map[int]bool{}
	for _, e := range strings.Split(value, ",") {
		e = strings.TrimSpace(e)
		if strings.HasPrefix(e, "MIG-") {
			return nil, fmt.Errorf("nvml: CUDA_VISIBLE_DEVICES names a MIG instance (%s): pass --gpu to plan for it", e)
		}
		d, ok := lookup(devs, e)
		if !ok || seen[d.Index] {
			break
		}
		seen[d.Index] = true
		out = append(out, d)
	}
	return out, nil
}

// lookup finds the device entry e names: an index, or a UUID or a prefix of
// exactly one.
func lookup(devs []Device, e string) (Device, bool) {
	if e == "" {
		return Device{}, false
	}
	if i, err := strconv.Atoi(e); err == nil {
		for _, d := range devs {
			if d.Index == i {
				return d, true
			}
		}
		return Device{}, false
	}
	var found []Device
	for _, d := range devs {
		if strings.HasPrefix(d.UUID, e) {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		return Device{}, false
	}
	return found[0], true
}

// VisibleDevices is Devices in CUDA's numbering: the GPUs this process's
// CUDA_VISIBLE_DEVICES lets it see, CUDA device k at index k of the list.
// Each Device keeps its NVML Index.
func VisibleDevices() ([]Device, error) {
	devs, err := Devices()
	if err != nil {
		return nil, err
	}
	value, set := os.LookupEnv("CUDA_VISIBLE_DEVICES")
	return Visible(devs, value, set)
}

// ProcessMemoryOf returns the device memory NVML attributes to this process
// on CUDA device ordinal (see VisibleDevices).
func ProcessMemoryOf(ordinal int) (int64, error) {
	devs, err := VisibleDevices()
	if err != nil {
		return 0, err
	}
	if ordinal < 0 || ordinal >= len(devs) {
		return 0, fmt.Errorf("nvml: CUDA device %d is not among the %d this process sees", ordinal, len(devs))
	}
	return ProcessMemory(devs[ordinal].Index)
}
