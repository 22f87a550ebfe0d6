package stages

import (
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/runtime/plan"
)

// releaser is a backend that can give its device memory back while the
// trainer sleeps and take it again (the CPU and CUDA backends).
type releaser interface {
	// Release frees the memory behind m, keeping m: views fail until
	// Reacquire.
	Release(m gpu.Memory) error
	// Reacquire allocates m's memory again (contents undefined).
	Reacquire(m gpu.Memory) error
	// ReleaseWorkspace frees the backend's own device buffers; no kernel
	// runs until ReacquireWorkspace.
	ReleaseWorkspace() error
	ReacquireWorkspace() error
}

// Asleep reports whether the trainer is asleep: the device arena released,
// the state it held in the host arena.
func (a *Arena) Asleep() bool { return a.asleep != nil }

// Sleep copies the device buffers the plan saves at the current op (a
// sleep op) into the pinned host area, waits for the copies, then releases
// the device arena and the backend's workspace. It returns the bytes
// copied. A sleeping arena stays asleep.
func (a *Arena) Sleep(b gpu.Backend) (int64, error) {
	if a.asleep != nil {
		return 0, nil
	}
	rel, ok := b.(releaser)
	if !ok {
		return 0, fmt.Errorf("sleep: the %s backend cannot release its device memory", b.Name())
	}
	var sp *plan.SleepPoint
	for i := range a.plan.Sleeps {
		if a.plan.Sleeps[i].Op == a.cur {
			sp = &a.plan.Sleeps[i]
		}
	}
	if sp == nil {
		return 0, fmt.Errorf("sleep: op %d is not a planned sleep", a.cur)
	}
	for _, s := range sp.Saved {
		dev, host, err := a.savedViews(s)
		if err != nil {
			return 0, err
		}
		if err := b.Copy(host, dev); err != nil {
			return 0, fmt.Errorf("sleep: saving %s: %w", s.Buffer, err)
		}
	}
	if err := b.Sync(); err != nil {
		return 0, fmt.Errorf("sleep: %w", err)
	}
	if err := rel.Release(a.dev); err != nil {
		return 0, fmt.Errorf("sleep: releasing the device arena: %w", err)
	}
	a.asleep = sp
	if err := rel.ReleaseWorkspace(); err != nil {
		return 0, fmt.Errorf("sleep: releasing the backend's workspace: %w", err)
	}
	return sp.Bytes, nil
}

// Wake reacquires the backend's workspace and the device arena and copies
// the saved buffers back, bit for bit. It returns the bytes copied. An
// awake arena stays awake.
func (a *Arena) Wake(b gpu.Backend) (int64, error) {
	sp := a.asleep
	if sp == nil {
		return 0, nil
	}
	rel, ok := b.(releaser)
	if !ok {
		return 0, fmt.Errorf("wake: the %s backend cannot reacquire device memory", b.Name())
	}
	if err := rel.ReacquireWorkspace(); err != nil {
		return 0, fmt.Errorf("wake: reacquiring the backend's workspace: %w", err)
	}
	if err := rel.Reacquire(a.dev); err != nil {
		return 0, fmt.Errorf("wake: reacquiring the %d-byte device arena: %w", a.dev.Size(), err)
	}
	a.asleep = nil
	for _, s := range sp.Saved {
		dev, host, err := a.savedViews(s)
		if err != nil {
			return 0, err
		}
		if err := b.Copy(dev, host); err != nil {
			return 0, fmt.Errorf("wake: restoring %s: %w", s.Buffer, err)
		}
	}
	if err := b.Sync(); err != nil {
		return 0, fmt.Errorf("wake: %w", err)
	}
	return sp.Bytes, nil
}

// savedViews returns a saved buffer's bytes in the device arena and in the
// host area, as I32 views (a same-dtype copy is a plain byte copy).
func (a *Arena) savedViews(s plan.Saved) (dev, host gpu.Tensor, err error) {
	n := int(s.Bytes / 4)
	if dev, err = gpu.NewTensor(a.dev, s.DeviceOffset, gpu.I32, n); err != nil {
		return
	}
	host, err = gpu.NewTensor(a.host, s.HostOffset, gpu.I32, n)
	return
}

// Readable returns t, or, while the trainer sleeps and t is a view of the
// device arena, the same bytes in the host area, so that checkpoints and
// exports read a sleeping trainer's state without waking it.
func (a *Arena) Readable(t gpu.Tensor) (gpu.Tensor, error) {
	if a.asleep == nil || t.Mem != a.dev {
		return t, nil
	}
	for _, s := range a.asleep.Saved {
		if s.DeviceOffset <= t.Off && t.Off+t.Bytes() <= s.DeviceOffset+s.Bytes {
			return gpu.Tensor{Mem: a.host, Off: s.HostOffset + (t.Off - s.DeviceOffset), DType: t.DType, Shape: t.Shape}, nil
		}
	}
	return gpu.Tensor{}, fmt.Errorf("arena: the trainer sleeps and bytes [%d, %d) of the device arena were not saved", t.Off, t.Off+t.Bytes())
}
