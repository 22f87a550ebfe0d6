package nvml

import (
	"errors"
	"testing"
)

// TestDevices checks both paths: without a driver Devices fails with
// ErrNoDriver (and never panics); with one it lists GPUs with memory.
func TestDevices(t *testing.T) {
	devs, err := Devices()
	if err != nil {
		if !errors.Is(err, ErrNoDriver) {
			t.Fatalf("Devices() = %v; without a driver the error must wrap ErrNoDriver", err)
		}
		if _, err := ProcessMemory(0); !errors.Is(err, ErrNoDriver) {
			t.Errorf("ProcessMemory(0) = %v, want ErrNoDriver", err)
		}
		t.Logf("no NVIDIA driver here: %v", err)
		return
	}
	for _, d := range devs {
		if d.Name == "" || d.MemoryBytes <= 0 || d.UsedBytes < 0 || d.UsedBytes > d.MemoryBytes {
			t.Errorf("implausible device %+v", d)
		}
	}
}
