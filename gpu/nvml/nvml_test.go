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

// TestEnergy checks both paths: without a driver OpenEnergy fails with
// ErrNoDriver; with a GPU its counter is positive, does not go back, and a
// closed meter refuses to read.
func TestEnergy(t *testing.T) {
	m, err := OpenEnergy(0)
	if err != nil {
		if _, derr := Devices(); derr != nil && !errors.Is(err, ErrNoDriver) {
			t.Fatalf("OpenEnergy(0) = %v without a driver; the error must wrap ErrNoDriver", err)
		}
		t.Logf("no energy counter here: %v", err)
		return
	}
	a, err := m.Joules()
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Joules()
	if err != nil {
		t.Fatal(err)
	}
	if a <= 0 || b < a {
		t.Errorf("energy counter read %v J, then %v J", a, b)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Joules(); err == nil {
		t.Error("a closed meter read the counter")
	}
}
