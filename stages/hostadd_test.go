package stages

import (
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
)

// Adds queued on the hostAdder run in queue order (two into one tensor add
// up exactly as if done in turn), reuse slots once free, and report the
// first error at wait.
func TestHostAdder(t *testing.T) {
	b := cpu.New()
	mem, err := b.Alloc(4 * 64)
	if err != nil {
		t.Fatal(err)
	}
	ten := func(off int, vals ...float32) gpu.Tensor {
		x, err := gpu.NewTensor(mem, int64(4*off), gpu.F32, len(vals))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Upload(x, vals); err != nil {
			t.Fatal(err)
		}
		return x
	}
	dst := ten(0, 1, 2)
	a := newHostAdder(b)
	for i := range 3 * hostAddSlots { // more adds than slots: slots are reused
		k := a.acquire()
		src := ten(8+2*k, float32(i), 0.5)
		ev, err := b.DefaultStream().Record()
		if err != nil {
			t.Fatal(err)
		}
		a.add(k, ev, dst, src)
	}
	if err := a.wait(); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 2)
	if err := b.Download(got, dst); err != nil {
		t.Fatal(err)
	}
	want := []float32{1, 2}
	for i := range 3 * hostAddSlots {
		want[0] += float32(i)
		want[1] += 0.5
	}
	if got[0] != want[0] || got[1] != want[1] {
		t.Errorf("dst = %v, want %v", got, want)
	}
	k := a.acquire()
	ev, _ := b.DefaultStream().Record()
	a.add(k, ev, dst, ten(40, 1, 2, 3)) // a size mismatch
	if err := a.wait(); err == nil {
		t.Error("wait after a failed add: no error")
	}
	if err := a.wait(); err != nil {
		t.Errorf("the error was reported twice: %v", err)
	}
}
