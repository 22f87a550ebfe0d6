package stages

import (
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/runtime/plan"
)

// An offloaded actor computed in bf16 with AdamW on the host keeps, under
// apply_fsdp2's host_bf16_copy, a bf16 copy of its masters in host memory,
// which its gathers copy to the device instead of casting the fp32 masters
// there. With the copy and without it, three steps on one and two ranks give the same
// updates (grad norms, metrics) and the same checkpoint bits; the plan
// holds the copy in host memory and, on one rank, no staging buffer for
// the actor's gathers. A run resumed from the checkpoint of step 1 (the
// copy rewritten from the restored masters) gives step 2 and 3's updates
// again, and so does a run whose precision policy leaves the head in
// fp32 (no copy of its own, the tied embedding's copy still read).
func TestHostBF16SameBits(t *testing.T) { testHostBF16SameBits(t, RunOptions{}, 2) }

// testHostBF16SameBits runs TestHostBF16SameBits's cases of at most
// maxDP ranks with base's backend and communicators.
func testHostBF16SameBits(t *testing.T, base RunOptions, maxDP int) {
	policy := "  precision: '\"fp32\"'\n  recompute: 'layer.index % 2 == 0'\n"
	for _, c := range []struct {
		name      string
		dp        int
		precision string
		noCopy    string // the kind of unit without a bf16 copy
	}{
		{"one rank", 1, `'"bf16"'`, ""},
		{"two ranks", 2, `'"bf16"'`, ""},
		{"fp32 head", 1, `'layer.kind == "head" ? "fp32" : "bf16"'`, "head"},
	} {
		if c.dp > maxDP {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			policies := "  precision: " + c.precision + "\n  recompute: 'layer.index % 2 == 0'\n  offload: 'model.trainable'\n  offload_optimizer: 'model.trainable'\n"
			type result struct {
				out  runOut
				job  *Job
				ckpt string
			}
			run := func(off bool, opts RunOptions) result {
				opts.Backend, opts.Comms = base.Backend, base.Comms
				edits := []string{policy, policies, "  steps: 2\n", "  steps: 3\n"}
				if !off {
					edits = append(edits, "      with: {model: actor}\n    - id: shard_ref", "      with: {model: actor, host_bf16_copy: true}\n    - id: shard_ref")
				}
				sp := tinyVariant(t, edits...)
				sp.Mesh.GPUsPerNode, sp.Mesh.DP = c.dp, c.dp
				res := result{ckpt: t.TempDir()}
				opts.AfterStep = func(r *Rank, sr StepResult) error {
					if sr.Step == 1 || sr.Step == 3 {
						return r.SaveShards(rankSub(res.ckpt, sr.Step))
					}
					return nil
				}
				res.out = runParsed(t, sp, nil, func(j *Job) { res.job = j }, opts)
				return res
			}
			off, on := run(true, RunOptions{}), run(false, RunOptions{})
			ckpt1 := rankSub(on.ckpt, 1)
			resumed := run(false, RunOptions{FirstStep: 2, Resume: func(r *Rank) error { return r.LoadShards(ckpt1) }})

			if len(off.out.steps) != 3 || len(on.out.steps) != 3 || len(resumed.out.steps) != 2 {
				t.Fatalf("steps: %d without the copy, %d with it, %d resumed; want 3, 3, 2", len(off.out.steps), len(on.out.steps), len(resumed.out.steps))
			}
			for k, sr := range on.out.steps {
				if !reflect.DeepEqual(sr.Stats.Updates, off.out.steps[k].Stats.Updates) {
					t.Errorf("step %d: updates with the copy %+v, without %+v", sr.Step, sr.Stats.Updates, off.out.steps[k].Stats.Updates)
				}
			}
			for k, sr := range resumed.out.steps {
				if !reflect.DeepEqual(sr.Stats.Updates, on.out.steps[k+1].Stats.Updates) {
					t.Errorf("resumed step %d: updates %+v, the run through %+v", sr.Step, sr.Stats.Updates, on.out.steps[k+1].Stats.Updates)
				}
			}
			for r := range c.dp {
				sameTensors(t, rankDir(rankSub(on.ckpt, 3), r), rankDir(rankSub(off.ckpt, 3), r))
				sameTensors(t, rankDir(rankSub(resumed.ckpt, 3), r), rankDir(rankSub(on.ckpt, 3), r))
			}

			copyBytes, h2d := map[bool]int64{}, map[bool]int64{}
			for k, p := range map[bool]*plan.Plan{true: off.out.p, false: on.out.p} {
				for _, b := range p.Buffers {
					switch {
					case b.Name == "actor.params_bf16":
						if !b.Host {
							t.Errorf("%s is not in host memory", b.Name)
						}
						copyBytes[k] += b.Bytes
					case strings.Contains(b.Name, "h2d") && strings.HasPrefix(b.Name, "train."):
						h2d[k] += b.Bytes
					}
				}
			}
			var want int64
			for _, u := range Units(on.job.Models["actor"], c.dp) {
				if string(u.Kind) != c.noCopy {
					want += plan.AlignUp(2 * u.ShardElems)
				}
			}
			if copyBytes[true] != 0 || copyBytes[false] != want {
				t.Errorf("bf16 copy: %d bytes planned without it, %d with it; want 0 and %d", copyBytes[true], copyBytes[false], want)
			}
			if h2d[true] == 0 || h2d[false] >= h2d[true] {
				t.Errorf("the train stage's staging for gathers: %d bytes without the copy, %d with it; want fewer", h2d[true], h2d[false])
			}
		})
	}
}

// rankSub is the directory of the checkpoint taken after step.
func rankSub(dir string, step int) string { return filepath.Join(dir, fmt.Sprintf("step-%d", step)) }

// TestHostBF16CopyRefused checks that validation refuses host_bf16_copy
// on a model whose optimizer step does not run on the host, naming the
// key and the model's policies.
func TestHostBF16CopyRefused(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	for _, c := range []struct{ name, policies string }{
		{"on the device", "policies:\n"},
		{"optimizer offloaded alone", "policies:\n  offload_optimizer: 'model.trainable'\n"},
	} {
		s := variant(t, path, "      with: {model: actor}\n    - id: shard_ref", "      with: {model: actor, host_bf16_copy: true}\n    - id: shard_ref",
			"policies:\n", c.policies)
		_, err := Resolve(s, testGPU, CheckRun)
		if err == nil || !strings.Contains(err.Error(), "host_bf16_copy needs a trained model whose params and optimizer state are both offloaded") ||
			!strings.Contains(err.Error(), "tiny-grpo.yaml:") {
			t.Errorf("%s: resolve: %v, want host_bf16_copy refused at its position", c.name, err)
		}
	}
}
