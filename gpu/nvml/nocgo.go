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
