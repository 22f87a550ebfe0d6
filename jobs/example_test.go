package jobs_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/rlpipe/rlpipe/jobs"
)

// Example shows a run that stops after a checkpoint and is resumed.
func Example() {
	root, _ := os.MkdirTemp("", "runs")
	defer os.RemoveAll(root)

	// rlpipe run job.yaml
	r, err := jobs.Create(root, jobs.Meta{Name: "grpo", SpecPath: "job.yaml", SpecDir: ".", Seed: 1, TotalSteps: 4, Version: "dev"})
	if err != nil {
		fmt.Println(err)
		return
	}
	r.WriteSpec([]byte("name: grpo\n"))
	r.WritePlan(map[string]int64{"peak_bytes": 1 << 30})
	update := 0
	for step := 1; step <= 3; step++ {
		for mb := 1; mb <= 2; mb++ { // two mini-batches, one PPO epoch
			update++
			r.AppendUpdate(jobs.Metrics{Step: step, Update: update, Epoch: 1, MiniBatch: mb, Loss: 1 / float64(update)})
		}
		r.AppendMetrics(jobs.Metrics{Step: step, Updates: 2, Loss: 1 / float64(step)})
		if step == 2 {
			dir, _ := r.CheckpointDir(step)
			os.WriteFile(filepath.Join(dir, "model.safetensors"), []byte("..."), 0o644)
			r.CommitCheckpoint(step)
		}
	}
	r.Close() // the process dies here

	// rlpipe run --resume <id>
	o, err := jobs.Open(root, r.ID()[:8])
	if err != nil {
		fmt.Println(err)
		return
	}
	defer o.Close()
	step, _, ok, err := o.Resume()
	ms, _ := o.Metrics()
	us, _ := o.Updates()
	fmt.Println(step, ok, err, len(ms), len(us), o.Meta().Status)
	// Output: 2 true <nil> 2 4 running
}
