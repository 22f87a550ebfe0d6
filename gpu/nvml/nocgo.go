//go:build !cgo

package nvml

import "fmt"

// Devices reports that this build has no NVML (it was built without cgo).
func Devices() ([]Device, error) {
	return nil, fmt.Errorf("%w: this rlpipe was built without cgo", ErrNoDriver)
}

// ProcessMemory reports that this build has no NVML.
func ProcessMemory(int) (int64, error) {
	return 0, fmt.Errorf("%w: this rlpipe was built without cgo", ErrNoDriver)
}

// EnergyMeter would read a GPU's energy counter; this build has no NVML.
type EnergyMeter struct{}

// OpenEnergy reports that this build has no NVML.
func OpenEnergy(int) (*EnergyMeter, error) {
	return nil, fmt.Errorf("%w: this rlpipe was built without cgo", ErrNoDriver)
}

// Joules reports that this build has no NVML.
func (*EnergyMeter) Joules() (float64, error) {
	return 0, fmt.Errorf("%w: this rlpipe was built without cgo", ErrNoDriver)
}

// Close does nothing.
func (*EnergyMeter) Close() error { return nil }
