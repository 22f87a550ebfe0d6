package stages

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
)

// autoLayers is the decoder layer count of autoSpec's model.
const autoLayers = 7

// autoChunkIDs are autoSpec's stages with a chunk_tokens parameter.
var autoChunkIDs = []string{"ref", "old", "train"}

// autoSpec writes the tiny job with a 7-layer model and 4096-token
// micro-batches, recompute written as rc ("" leaves the key out: auto)
// and the stages' chunk_tokens as chunks ("" leaves it out: auto), and
// resolves it for planning on a GPU of budget bytes.
func autoSpec(t *testing.T, budget int64, rc string, chunks map[string]string) *Job {
	t.Helper()
	dir := t.TempDir()
	cfg := strings.Replace(readFile(t, filepath.Join("testdata", "tiny", "config.json")), `"num_hidden_layers": 2`, fmt.Sprintf(`"num_hidden_layers": %d`, autoLayers), 1)
	if err := os.MkdirAll(filepath.Join(dir, "tiny"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tiny", "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	with := func(id string) string {
		if c := chunks[id]; c != "" {
			return ", chunk_tokens: " + c
		}
		return ""
	}
	policies := ""
	if rc != "" {
		policies = fmt.Sprintf("policies:\n  recompute: '%s'\n", rc)
	}
	src := fmt.Sprintf(`version: 1
name: auto
models:
  actor: {path: tiny}
  ref: {copy_of: actor}
data:
  rollouts: rollouts.jsonl
  global_batch_size: 4
  max_tokens_per_gpu: 4096
  max_seq_len: 8
train:
  steps: 1
%sstages:
  setup:
    - {id: load, uses: load_hf, with: {model: actor}}
    - {id: shard_actor, uses: apply_fsdp2, needs: load, with: {model: actor}}
    - {id: shard_ref, uses: apply_fsdp2, needs: load, with: {model: ref}}
  step:
    - {id: pack, uses: pack}
    - {id: ref, uses: ref_logprob, needs: pack, with: {model: ref%s}}
    - {id: old, uses: actor_logprob, needs: pack, with: {model: actor%s}}
    - {id: train, uses: train, needs: [ref, old], with: {kl: k3, kl_coef: 0.1%s}}
`, policies, with("ref"), with("old"), with("train"))
	path := filepath.Join(dir, "auto.yaml")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := spec.Load(path)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	j, err := Resolve(s, GPU{Name: "test", Bytes: budget, Source: "test"}, CheckPlan)
	if err != nil {
		t.Fatalf("resolve: %v", err)
	}
	return j
}

// autoTotal plans the job as written (no auto) and returns its device
// total.
func autoTotal(t *testing.T, rc string, chunks map[string]string) int64 {
	t.Helper()
	p, err := Plan(autoSpec(t, 1<<40, rc, chunks))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Auto) != 0 {
		t.Fatalf("a spec with nothing auto made choices: %+v", p.Auto)
	}
	return p.DeviceTotal()
}

// TestPlanAuto checks what Plan chooses under policies.recompute auto and
// chunk_tokens auto against plans of the same job written out: the
// fewest recomputed layers (layers 0 to k-1) whose job fits, then for each
// stage in order the largest chunk (1024 doubled, up to the 4096 rows of
// a micro-batch) that still fits; and that the plan of the choices is the
// plan of the written-out spec, byte for byte.
func TestPlanAuto(t *testing.T) {
	start := map[string]string{"ref": "1024", "old": "1024", "train": "1024"}
	totals := make([]int64, autoLayers+1) // by recomputed layers, chunks 1024
	least := 0
	for k := range totals {
		totals[k] = autoTotal(t, fmt.Sprintf("layer.index < %d", k), start)
		if totals[k] < totals[least] {
			least = k
		}
	}
	// fewest is what auto must choose for a budget: the fewest layers
	// whose total fits, else the count of the least total.
	fewest := func(budget int64) (int, bool) {
		for k, tot := range totals {
			if tot <= budget {
				return k, true
			}
		}
		return least, false
	}
	cases := []struct {
		name   string
		budget int64
	}{
		{"everything fits", 1 << 40},
		{"exactly 3 layers", totals[3]},
		{"just under 3 layers", totals[3] - 1},
		{"just over 1 layer", totals[1] + 1},
		{"the last layers", min(totals[autoLayers-1], totals[autoLayers])},
		{"nothing fits", totals[least] - 1},
	}
	if totals[least] >= totals[0] || totals[3] >= totals[1] {
		t.Fatalf("recomputing layers saves nothing: totals %v", totals)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantK, fits := fewest(c.budget)
			c := struct {
				name   string
				budget int64
				wantK  int
				fits   bool
			}{c.name, c.budget, wantK, fits}
			j := autoSpec(t, c.budget, "", nil)
			p, err := Plan(j)
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Fits(c.budget); got != c.fits {
				t.Fatalf("fits = %v, want %v (total %d, budget %d)", got, c.fits, p.DeviceTotal(), c.budget)
			}
			if got := j.auto.recompute["actor"]; got != c.wantK {
				t.Fatalf("recomputes %d layers, want %d", got, c.wantK)
			}
			if len(p.Auto) != 1+len(autoChunkIDs) || p.Auto[0].Key != "policies.recompute" || p.Auto[0].Subject != "model actor" {
				t.Fatalf("choices = %+v", p.Auto)
			}
			// The recomputed layers are the first k: only they plan the
			// recomputed forward's buffers.
			for i := range autoLayers {
				has := p.Buffer(fmt.Sprintf("train.rc.layer%d.gate", i)) != nil
				if has != (i < c.wantK) {
					t.Errorf("layer %d: recompute buffers %v, want %v", i, has, i < c.wantK)
				}
			}
			// Each chunk is the largest that fits given the chunks before
			// it (and the start for those after).
			chosen := map[string]string{}
			for _, id := range autoChunkIDs {
				chosen[id] = fmt.Sprint(j.auto.chunks[id])
			}
			rc := fmt.Sprintf("layer.index < %d", c.wantK)
			for i, id := range autoChunkIDs {
				n := j.auto.chunks[id]
				if n < 1024 || n > 4096 || n&(n-1) != 0 {
					t.Fatalf("stage %s: chunk %d, want 1024, 2048 or 4096", id, n)
				}
				if n == 4096 || !c.fits {
					continue
				}
				next := map[string]string{}
				for k, id2 := range autoChunkIDs {
					switch {
					case k < i:
						next[id2] = chosen[id2]
					case k == i:
						next[id2] = fmt.Sprint(2 * n)
					default:
						next[id2] = "1024"
					}
				}
				if tot := autoTotal(t, rc, next); tot <= c.budget {
					t.Errorf("stage %s: chunk %d chosen, but %d fits too (%d of %d bytes)", id, n, 2*n, tot, c.budget)
				}
			}
			if c.fits && c.wantK < autoLayers && c.wantK > 0 {
				if !strings.Contains(p.Auto[0].Why, fmt.Sprintf("%d would need %s", c.wantK-1, plan.GiB(totals[c.wantK-1]))) {
					t.Errorf("why = %q, want the total with one layer fewer", p.Auto[0].Why)
				}
			}
			// The plan of the choices is the plan of the spec written out.
			want := autoTotal(t, rc, chosen)
			if p.DeviceTotal() != want || p.PeakBytes != autoPeak(t, rc, chosen) {
				t.Errorf("auto plan total %d, written-out %d", p.DeviceTotal(), want)
			}
		})
	}
}

func autoPeak(t *testing.T, rc string, chunks map[string]string) int64 {
	t.Helper()
	p, err := Plan(autoSpec(t, 1<<40, rc, chunks))
	if err != nil {
		t.Fatal(err)
	}
	return p.PeakBytes
}

// TestRunUnplanned checks that a job whose auto choices were never made
// is refused rather than run with some default.
func TestRunUnplanned(t *testing.T) {
	j := autoSpec(t, 1<<40, "", nil)
	if _, err := Run(t.Context(), j, &plan.Plan{}, RunOptions{}); err == nil || !strings.Contains(err.Error(), "not planned") {
		t.Fatalf("err = %v, want the job refused as not planned", err)
	}
}
