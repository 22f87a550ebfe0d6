package stages

import (
	"errors"
	"fmt"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/runtime/plan"
)

// Arena is one rank's memory at run time: the device arena and the pinned
// host arena of the plan, each allocated once, handing out the planned
// offsets. It follows the plan's op sequence: Enter must name the next
// planned op (or the first op of the current loop, to repeat a micro-batch),
// and a buffer may be used only while the current op is inside its planned
// lifetime. It measures the bytes in use (buffers that were used and are
// live at the current op), so a test can hold the high-water mark against
// the plan's peak.
type Arena struct {
	plan *plan.Plan
	dev  gpu.Memory
	res  gpu.Memory // the resident arena: kept while the trainer sleeps
	host gpu.Memory
	// asleep is the sleep the trainer is in (nil: awake): dev is released
	// and the saved buffers are in the host arena.
	asleep *plan.SleepPoint
	byName map[string]*plan.Buffer
	cur    int // current op index; -1 before the first op
	used   map[*plan.Buffer]bool
	high   int64
	highOp int
}

// NewArena allocates the plan's device and host arenas on b.
func NewArena(b gpu.Backend, p *plan.Plan) (*Arena, error) {
	a := &Arena{plan: p, byName: make(map[string]*plan.Buffer, len(p.Buffers)), cur: -1, used: map[*plan.Buffer]bool{}}
	for _, buf := range p.Buffers {
		a.byName[buf.Name] = buf
	}
	var err error
	if a.dev, err = b.Alloc(max(p.DeviceArena, plan.Align)); err != nil {
		return nil, fmt.Errorf("allocating the %d-byte device arena: %w", p.DeviceArena, err)
	}
	if a.res, err = b.Alloc(max(p.ResidentArena, plan.Align)); err != nil {
		b.Free(a.dev)
		return nil, fmt.Errorf("allocating the %d-byte resident device arena: %w", p.ResidentArena, err)
	}
	if a.host, err = b.AllocHost(max(p.HostArena, plan.Align)); err != nil {
		b.Free(a.dev)
		b.Free(a.res)
		return nil, fmt.Errorf("allocating the %d-byte pinned host arena: %w", p.HostArena, err)
	}
	return a, nil
}

// Plan returns the plan the arena follows.
func (a *Arena) Plan() *plan.Plan { return a.plan }

// Enter moves to op index i, which must be the op after the current one or
// an earlier op of the current stage (a loop back to repeat a micro-batch).
// name must be the planned op's name.
func (a *Arena) Enter(i int, name string) error {
	if i < 0 || i >= len(a.plan.Ops) {
		return fmt.Errorf("arena: op %d %q is outside the plan (%d ops)", i, name, len(a.plan.Ops))
	}
	op := a.plan.Ops[i]
	if op.Name != name {
		return fmt.Errorf("arena: the executor ran %q where the plan has op %d %q", name, i, op.Name)
	}
	if i != a.cur+1 && !(i <= a.cur && a.cur >= 0 && a.plan.Ops[a.cur].Stage == op.Stage) {
		return fmt.Errorf("arena: op %d %q entered after op %d; the plan runs them in order", i, name, a.cur)
	}
	a.cur = i
	a.account()
	return nil
}

// EnterNamed enters the next op of the plan, which must be named name.
func (a *Arena) EnterNamed(name string) error { return a.Enter(a.cur+1, name) }

// Current returns the current op index.
func (a *Arena) Current() int { return a.cur }

func (a *Arena) account() {
	var n int64
	for b := range a.used {
		if b.Start <= a.cur && a.cur <= b.End {
			n += b.Bytes
		}
	}
	if n > a.high {
		a.high, a.highOp = n, a.cur
	}
}

// HighWater returns the most bytes in use at any op so far, and that op.
// Device buffers only.
func (a *Arena) HighWater() (int64, int) { return a.high, a.highOp }

// Tensor returns the view of the planned buffer name with the given dtype
// and shape, which must fit in the buffer. Using a buffer marks it in use for
// the ops of its lifetime; it is an error to use it at an op outside its
// lifetime when the use is immediate (now true).
func (a *Arena) Tensor(name string, dt gpu.DType, shape ...int) (gpu.Tensor, error) {
	b, ok := a.byName[name]
	if !ok {
		return gpu.Tensor{}, fmt.Errorf("arena: no planned buffer %q", name)
	}
	n := int64(dt.Size())
	for _, d := range shape {
		n *= int64(d)
	}
	if n > b.Bytes {
		return gpu.Tensor{}, fmt.Errorf("arena: %s %v needs %d bytes; the plan gave buffer %q %d", dt, shape, n, name, b.Bytes)
	}
	if a.cur > b.End {
		return gpu.Tensor{}, fmt.Errorf("arena: buffer %q used at op %d %q, after its planned lifetime [%d, %d]", name, a.cur, a.plan.Ops[a.cur].Name, b.Start, b.End)
	}
	mem := a.dev
	switch {
	case b.Host:
		mem = a.host
	case b.Resident:
		mem = a.res
	case a.asleep != nil:
		return gpu.Tensor{}, fmt.Errorf("arena: buffer %q is in the device arena, which is released while the trainer sleeps (since stage %q)", name, a.asleep.Stage)
	}
	if !b.Host && !a.used[b] {
		a.used[b] = true
		a.account()
	}
	return gpu.NewTensor(mem, b.Offset, dt, shape...)
}

// Free releases the arenas.
func (a *Arena) Free(b gpu.Backend) error {
	return errors.Join(b.Free(a.dev), b.Free(a.res), b.Free(a.host))
}

// Rewind goes back to op i of the current stage: the next Enter must be op i.
func (a *Arena) Rewind(i int) error {
	if a.cur < 0 || i > a.cur+1 || i < 0 || a.plan.Ops[i].Stage != a.plan.Ops[max(a.cur, 0)].Stage {
		return fmt.Errorf("arena: cannot rewind from op %d to op %d", a.cur, i)
	}
	a.cur = i - 1
	return nil
}

// StartStage positions the arena before the first op of stage id, so the
// stage's first Enter is its first planned op. Stages run in plan order, may
// be skipped (by `when`), and the step stages repeat every step.
func (a *Arena) StartStage(id string) error {
	for _, s := range a.plan.Stages {
		if s.ID == id {
			a.cur = s.First - 1
			return nil
		}
	}
	return fmt.Errorf("arena: stage %q is not in the plan", id)
}
