package stages

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/spec"
)

// TestSnapshot checks train.checkpoint_async's snapshot on dp 1 and 2: a
// snapshot taken after step 1 and written after step 2 has trained is
// step 1's checkpoint byte for byte (SaveShards at step 1), and differs
// from step 2's; the plan holds each model's snapshot in pinned host
// memory.
func TestSnapshot(t *testing.T) {
	for _, dp := range []int{1, 2} {
		s, err := spec.Load(filepath.Join("..", "examples", "tiny-grpo.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		s.Mesh.GPUsPerNode, s.Mesh.DP = dp, dp
		s.Train.CheckpointAsync = true
		j := resolveSpec(t, s)
		p, err := Plan(j)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"actor.snapshot", "ref.snapshot"} {
			b := p.Buffer(name)
			if b == nil || !b.Host {
				t.Fatalf("dp %d: %s = %+v, want a pinned host buffer", dp, name, b)
			}
		}
		if want := p.Buffer("actor.params").Bytes + p.Buffer("actor.adam_m").Bytes + p.Buffer("actor.adam_v").Bytes; p.Buffer("actor.snapshot").Bytes != want {
			t.Errorf("dp %d: actor.snapshot is %d bytes, want params + m + v = %d", dp, p.Buffer("actor.snapshot").Bytes, want)
		}
		dir := t.TempDir()
		at := func(what string) string { return filepath.Join(dir, what) }
		opts := RunOptions{Steps: 2, AfterStep: func(r *Rank, sr StepResult) error {
			switch sr.Step {
			case 1:
				if err := r.SaveShards(at("step1")); err != nil {
					return err
				}
				return r.Snapshot()
			case 2:
				if err := r.SaveShards(at("step2")); err != nil {
					return err
				}
				return r.SaveSnapshot(at("snapshot1"))
			}
			return nil
		}}
		if _, err := Run(context.Background(), j, p, opts); err != nil {
			t.Fatal(err)
		}
		for r := range dp {
			read := func(what string) []byte {
				b, err := os.ReadFile(filepath.Join(rankDir(at(what), r), model.SingleFileName))
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
			one, two, snap := read("step1"), read("step2"), read("snapshot1")
			if !bytes.Equal(snap, one) {
				t.Errorf("dp %d rank %d: the snapshot of step 1, written after step 2, differs from step 1's checkpoint", dp, r)
			}
			if bytes.Equal(one, two) {
				t.Errorf("dp %d rank %d: steps 1 and 2 saved the same state", dp, r)
			}
		}
	}
}
