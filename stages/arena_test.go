package stages

import (
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
	"github.com/rlpipe/rlpipe/runtime/plan"
)

// arenaPlan is a two-stage plan: stage s has ops a, b, c and buffer x live
// over [a, b] and y over [c, c]; stage t has op d.
func arenaPlan(t *testing.T) *plan.Plan {
	t.Helper()
	b := plan.NewBuilder()
	b.BeginStage("s", "k", "step")
	a := b.Op("a")
	bb := b.Op("b")
	c := b.Op("c")
	b.Alloc("x", plan.IO, 1024, a, bb)
	b.Alloc("y", plan.IO, 512, c, c)
	b.BeginStage("t", "k", "step")
	b.Op("d")
	p, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestArenaRefuses(t *testing.T) {
	tests := []struct {
		name string
		run  func(a *Arena) error
		want string // substring of the error; "" for success
	}{
		{"the planned sequence", func(a *Arena) error {
			for _, op := range []string{"a", "b", "c"} {
				if err := a.EnterNamed(op); err != nil {
					return err
				}
			}
			return nil
		}, ""},
		{"an op the plan does not have next", func(a *Arena) error {
			if err := a.EnterNamed("a"); err != nil {
				return err
			}
			return a.EnterNamed("c")
		}, `ran "c" where the plan has op 1 "b"`},
		{"a buffer after its lifetime", func(a *Arena) error {
			for _, op := range []string{"a", "b", "c"} {
				if err := a.EnterNamed(op); err != nil {
					return err
				}
			}
			_, err := a.Tensor("x", gpu.F32, 4)
			return err
		}, "after its planned lifetime"},
		{"a view larger than planned", func(a *Arena) error {
			if err := a.EnterNamed("a"); err != nil {
				return err
			}
			_, err := a.Tensor("x", gpu.F32, 1024)
			return err
		}, "needs 4096 bytes"},
		{"an unplanned buffer", func(a *Arena) error {
			_, err := a.Tensor("z", gpu.F32, 1)
			return err
		}, `no planned buffer "z"`},
		{"a loop back within the stage", func(a *Arena) error {
			for _, op := range []string{"a", "b"} {
				if err := a.EnterNamed(op); err != nil {
					return err
				}
			}
			if err := a.Rewind(0); err != nil {
				return err
			}
			return a.EnterNamed("a")
		}, ""},
		{"skipping to a later stage", func(a *Arena) error {
			if err := a.StartStage("t"); err != nil {
				return err
			}
			return a.EnterNamed("d")
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := NewArena(cpu.New(), arenaPlan(t))
			if err != nil {
				t.Fatal(err)
			}
			err = tt.run(a)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestArenaHighWater checks the measure the run tests rely on: a buffer
// counts while it has been used and the current op is in its lifetime.
func TestArenaHighWater(t *testing.T) {
	p := arenaPlan(t)
	a, err := NewArena(cpu.New(), p)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"a", "b", "c"} {
		if err := a.EnterNamed(op); err != nil {
			t.Fatal(err)
		}
		name := map[string]string{"a": "x", "c": "y"}[op]
		if name != "" {
			if _, err := a.Tensor(name, gpu.F32, 4); err != nil {
				t.Fatal(err)
			}
		}
	}
	if hw, op := a.HighWater(); hw != 1024 || op != 0 {
		t.Errorf("high-water %d at op %d, want 1024 at op 0 (x alone; y is smaller and later)", hw, op)
	}
	if p.PeakBytes != 1024 {
		t.Errorf("plan peak %d, want 1024", p.PeakBytes)
	}
}
