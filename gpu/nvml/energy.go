//go:build cgo

package nvml

import (
	"fmt"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// EnergyMeter reads one GPU's energy counter: NVML's total energy
// consumption of the board since the driver loaded, in millijoules. It
// keeps NVML initialised until Close, so that a read is one driver query.
type EnergyMeter struct {
	mu     sync.Mutex
	dev    gonvml.Device
	closed bool
}

// OpenEnergy returns the energy meter of CUDA device ordinal (see
// VisibleDevices), or an error where NVML or the GPU's counter is not
// there (GPUs before Volta have none).
func OpenEnergy(ordinal int) (m *EnergyMeter, err error) {
	defer func() {
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("%w: %v", ErrNoDriver, r)
		}
	}()
	devs, err := VisibleDevices()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= len(devs) {
		return nil, fmt.Errorf("nvml: CUDA device %d is not among the %d this process sees", ordinal, len(devs))
	}
	if ret := gonvml.Init(); ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("%w: %s", ErrNoDriver, gonvml.ErrorString(ret))
	}
	d, ret := gonvml.DeviceGetHandleByIndex(devs[ordinal].Index)
	if ret == gonvml.SUCCESS {
		_, ret = d.GetTotalEnergyConsumption()
	}
	if ret != gonvml.SUCCESS {
		gonvml.Shutdown()
		return nil, fmt.Errorf("nvml: energy counter of device %d: %s", devs[ordinal].Index, gonvml.ErrorString(ret))
	}
	return &EnergyMeter{dev: d}, nil
}

// Joules returns the counter, in joules.
func (m *EnergyMeter) Joules() (float64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, fmt.Errorf("nvml: energy meter closed")
	}
	mj, ret := m.dev.GetTotalEnergyConsumption()
	if ret != gonvml.SUCCESS {
		return 0, fmt.Errorf("nvml: energy counter: %s", gonvml.ErrorString(ret))
	}
	return float64(mj) / 1e3, nil
}

// Close releases NVML (once).
func (m *EnergyMeter) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	if ret := gonvml.Shutdown(); ret != gonvml.SUCCESS {
		return fmt.Errorf("nvml: shutdown: %s", gonvml.ErrorString(ret))
	}
	return nil
}
