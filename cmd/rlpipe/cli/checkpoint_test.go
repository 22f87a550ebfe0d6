package cli

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/jobs"
)

// TestAsyncCheckpoint runs the tiny recipe (one rank, and dp 2 in one
// process) with a checkpoint every 2 steps, written at the step's end and
// with train.checkpoint_async, and checks that the background writes
// commit the same checkpoints, byte for byte, though the ranks trained on
// while they were written: each file holds its step's state.
func TestAsyncCheckpoint(t *testing.T) {
	for _, name := range []string{"tiny-grpo.yaml", "tiny-dp2.yaml"} {
		t.Run(name, func(t *testing.T) {
			every := "checkpoint_every: 2"
			runs := map[bool]*jobs.Run{}
			for _, async := range []bool{false, true} {
				extra := every
				if async {
					extra += "\n  checkpoint_async: true"
				}
				spec := exampleVariant(t, name, "checkpoint_every: 6", extra)
				root := t.TempDir()
				if code, out, errs := runCLI(t, "run", "--runs", root, spec); code != exitOK {
					t.Fatalf("async %v: exit %d\n%s%s", async, code, out, errs)
				}
				runs[async] = onlyRun(t, root)
			}
			for _, async := range []bool{false, true} {
				cks, err := runs[async].Checkpoints()
				if err != nil {
					t.Fatal(err)
				}
				var steps []int
				for _, c := range cks {
					steps = append(steps, c.Step)
				}
				if fmt.Sprint(steps) != "[2 4 6 8 10 12]" {
					t.Errorf("async %v: committed checkpoints %v, want every 2 steps", async, steps)
				}
			}
			log := string(readAll(t, filepath.Join(runs[true].Dir(), jobs.LogFileName)))
			if strings.Count(log, `"checkpoint snapshot taken"`) != 6 || strings.Count(log, `"checkpoint saved"`) != 6 {
				t.Errorf("the async run's log does not have 6 snapshots and 6 saves:\n%s", log)
			}
			ranks := 1
			if name == "tiny-dp2.yaml" {
				ranks = 2
			}
			for _, step := range []int{2, 8, 12} {
				for r := range ranks {
					f := filepath.Join(jobs.CheckpointsDir, fmt.Sprintf("step-%d", step), fmt.Sprintf("rank-%d", r), "model.safetensors")
					a, b := readAll(t, filepath.Join(runs[false].Dir(), f)), readAll(t, filepath.Join(runs[true].Dir(), f))
					if !bytes.Equal(a, b) {
						t.Errorf("%s differs between the checkpoint written at the step's end and the one written in the background", f)
					}
				}
			}
		})
	}
}
